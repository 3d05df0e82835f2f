r"""RoBERTa pretraining (Liu et al. 2019) with the paper's recipe (its Table 9): base | large, and tiny, the CPU
demo's size on the generated corpus (as configs/tiny.py).

  python -m jbert.data prepare --input='gs://BUCKET/text/*.parquet' --output=gs://BUCKET/corpus_bpe \
      --train_vocab=50265 --vocab_kind=bpe
  python run.py --config=configs/roberta.py:base --workdir=gs://BUCKET/roberta_base \
      --config.data.prepared=gs://BUCKET/corpus_bpe
  python run.py --config=configs/roberta.py:tiny --workdir=/tmp/roberta_tiny

MLM only (no NSP) on FULL-SENTENCES rows (whole sentences packed to the length across document boundaries, no
short sequences), masks drawn again every epoch (dynamic masking, as in every jbert config), the model as
transformers' RobertaModel (`model_type` roberta: one token type, LayerNorm eps 1e-5, positions from the padding
id + 1, so the position table is the length + 2). WORKDIR/export is a RobertaForMaskedLM folder with the corpus's
tokenizer (a byte-level BPE when prepared with --vocab_kind=bpe, as RoBERTa's). The paper's batch is 8K sequences
of 512 tokens: on fewer chips keep it with --config.optim.grad_accum_steps, or scale batch_size, the learning
rate and the steps down together as the paper's Table 3 did (2K sequences at 7e-4 for 125K steps, 256 at 1e-4 for
1M). Everything else (corpus, packing, resume, sharding) is pretraining's: configs/base.py.
"""
import ml_collections

from configs import base

# name: (preset, peak lr, batch, steps, warmup, length)
SIZES = {
    "tiny": ("tiny", 1e-3, 32, 600, 60, 64),
    "base": ("base", 6e-4, 8192, 500_000, 24_000, 512),
    "large": ("large", 4e-4, 8192, 500_000, 30_000, 512),
}


def get_config(arg=None):
  if arg not in SIZES:
    raise ValueError(f"configs/roberta.py:{arg}: name a size, one of {list(SIZES)} (e.g. configs/roberta.py:base).")
  preset, lr, batch, steps, warmup, length = SIZES[arg]
  config = base.get_config()
  with config.unlocked():
    config.batch_size = batch                 # sequences of `length` tokens per step (the paper: 8K)
    config.total_steps = steps                # the paper's 500K updates
    config.model.preset = preset              # 12 x 768 (base), 24 x 1024 (large); tiny: 2 x 128
    config.model.model_type = "roberta"       # the family's fields (jbert/model/families/roberta.py) and its
                                              # export as transformers' Roberta* classes
    config.model.max_position_embeddings = length + 2  # fairseq's table: rows 0..pad_id serve padding
    config.data.nsp = False                   # no next-sentence prediction: MLM only (the paper's Table 2)
    config.data.short_seq_prob = 0.0          # FULL-SENTENCES: every row filled to the length
    config.data.max_seq_length = length       # the paper's T = 512
    config.optim.learning_rate = lr           # peak, after `warmup` linear steps, then linear decay to 0
    config.optim.warmup_steps = warmup        # the paper: 24K base, 30K large
    config.optim.b2 = 0.98                    # the paper's Adam beta2, steadier with large batches
    config.optim.eps = 1e-6                   # the paper's Adam epsilon
    config.optim.weight_decay = 0.01          # the paper's (decoupled) decay
    config.optim.grad_clip_norm = 0.0         # the paper clips nothing
    if arg == "tiny":
      config.log_every_steps = 50
      config.eval_every_steps = 200
      config.eval_batches = 4
      config.checkpoint_every_steps = 200
      config.model.dtype = "float32"          # CPUs compute bf16 slowly
      config.model.scan_layers = False
      config.data.source = "synthetic"        # the generated corpus and its WordPiece vocabulary (its [PAD] id
      config.data.vocab = None                # is the pad_token_id RoBERTa's positions skip)
      config.data.worker_count = 0            # worker processes only slow a 2-core CPU down
      config.optim.grad_clip_norm = 1.0       # a tiny model at lr 1e-3 and batch 32 needs it
  config.lock()
  return config
