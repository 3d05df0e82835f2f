"""A per-token classifier with a linear-chain CRF over its tag scores (NER's "Per Token -> Dense -> CRF").

`BertForTokenClassificationCRF` is `BertForTokenClassification` (same `bert` and `classifier` parameters, same
logits: the CRF's emissions) plus the CRF's transitions under `crf` (`jbert.model.crf.CRF`: `transitions` [C, C],
`start_transitions` [C], `end_transitions` [C], logical axes None, so they are replicated). Its parameters without
`crf` are a `BertForTokenClassification`'s, which is how the CRF task exports them for transformers.

The model returns the transitions with the logits (`CRFTaggerOutput.potentials`) rather than a loss or a decoding:
which positions form the chain (the first sub-token of each word), the gold tags and the tagging scheme's
constraints are the task's, and it calls `crf.log_likelihood` / `crf.viterbi_decode` with them.
"""
from __future__ import annotations

from typing import Optional

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from jbert.model import crf as crf_lib
from jbert.model.config import BertConfig
from jbert.model.heads import classifier_layer, head_dropout, token_states  # the same layers as NER's head
from jbert.model.outputs import Arrays

Array = jax.Array


@flax.struct.dataclass
class CRFTaggerOutput:
  last_hidden_state: Array  # [B, T, H]
  logits: Array  # [B, T, C] float32: the CRF's emissions
  potentials: crf_lib.Potentials  # transitions [C, C], start [C], end [C] (the parameters, float32)
  hidden_states: Arrays = None
  attentions: Arrays = None
  pooled_output: Optional[Array] = None  # Always None: this head has no pooler.


class BertForTokenClassificationCRF(nn.Module):
  """BERT, a per-token Dense to `num_labels` tag scores, and a CRF's transitions between the tags."""
  config: BertConfig
  num_labels: int = 2

  @nn.compact
  def __call__(self, input_ids, token_type_ids=None, attention_mask=None, deterministic: bool = True,
               output_hidden_states: bool = False, output_attentions: bool = False, *, segment_ids=None,
               position_ids=None) -> CRFTaggerOutput:
    x, out = token_states(self.config, input_ids, token_type_ids, attention_mask, deterministic,
                          output_hidden_states, output_attentions, segment_ids, position_ids)
    x = head_dropout(self.config, per_token=True)(x, deterministic=deterministic)
    logits = classifier_layer(self.config, self.num_labels, "classifier")(x).astype(jnp.float32)  # [B, T, C]
    crf = crf_lib.CRF(self.num_labels, param_dtype=jnp.dtype(self.config.param_dtype), name="crf")
    potentials = jax.tree.map(lambda p: p.astype(jnp.float32), crf.potentials())
    return CRFTaggerOutput(last_hidden_state=out.last_hidden_state, logits=logits, potentials=potentials,
                           hidden_states=out.hidden_states, attentions=out.attentions)
