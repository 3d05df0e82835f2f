"""Input pipelines: pretraining (sources → instances → dynamic masking → grain loader) and `finetune/`.

The pretraining entry points live in `jbert.data.loader` (`make_pretrain_iterator`, `make_eval_batches`,
`build_tokenizer`) and `jbert.data.prepare` (`python -m jbert.data prepare`); they are not imported here so that
fine-tuning code does not pay for grain.
"""
from jbert.data.config import default_pretrain_config

__all__ = ["default_pretrain_config"]
