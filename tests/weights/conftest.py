"""A tiny transformers BERT with non-trivial weights, and a batch with padding and two segments."""
import numpy as np
import pytest
import torch
import transformers

HF_CONFIG = dict(vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
                 max_position_embeddings=40, type_vocab_size=2, hidden_act="gelu", attn_implementation="eager")


def torch_model(cls_name="BertForPreTraining", seed=0, **kwargs):
  torch.manual_seed(seed)
  model = getattr(transformers, cls_name)(transformers.BertConfig(**HF_CONFIG, **kwargs)).eval()
  with torch.no_grad():  # LayerNorms and biases are ones/zeros at init: perturb them so they are tested.
    for name, p in model.named_parameters():
      if "LayerNorm" in name or name.endswith("bias"):
        p.add_(0.1 * torch.randn_like(p))
  return model


@pytest.fixture
def batch():
  rng = np.random.default_rng(0)
  ids = rng.integers(1, 99, size=(3, 12)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, 8:] = 0
  mask[2, 5:] = 0
  types = np.zeros_like(ids)
  types[:, 6:] = 1
  return {"input_ids": ids * mask, "token_type_ids": types * mask, "attention_mask": mask}


def torch_outputs(model, batch):
  with torch.no_grad():
    return model(**{k: torch.tensor(v, dtype=torch.long) for k, v in batch.items()})
