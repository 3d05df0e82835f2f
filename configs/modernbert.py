r"""ModernBERT pretraining (Warner et al. 2024) with the paper's recipe (its Table 3): base | large at 1,024 tokens,
then base_long | large_long, the long-context phase at 8,192; tiny and tiny_long, the CPU demo's sizes.

  python -m jbert.data prepare --input='gs://BUCKET/text/*.parquet' --output=gs://BUCKET/corpus_bpe \
      --train_vocab=50280 --vocab_kind=bpe --nolowercase
  python run.py --config=configs/modernbert.py:base --workdir=gs://BUCKET/mbert_base \
      --config.data.prepared=gs://BUCKET/corpus_bpe
  python run.py --config=configs/modernbert.py:base_long --workdir=gs://BUCKET/mbert_base_long \
      --config.init_from=gs://BUCKET/mbert_base
  python run.py --config=configs/modernbert.py:tiny --workdir=/tmp/mbert_tiny

The model is transformers' ModernBertModel (`model_type` modernbert: pre-norm layers without biases, GeGLU,
rotary positions, a global attention layer every third and a 128-token sliding window on the others). MLM only
(no NSP) at 30% masking on packed rows (documents laid end to end, each attending to itself, positions restarting
per document), StableAdamW (betas 0.9/0.98, eps 1e-6, no gradient clipping: its update clipping replaces it),
weight decay 1e-5 per step, fully decoupled (optimi's decouple_lr; jbert's decay multiplies the learning rate, so
the key holds 1e-5 / peak and follows an overridden learning rate), none on norms, biases and the embedding table,
and a warmup-stable-decay schedule: phase 1 warms up and holds its peak to the end (the paper decays only at the
end of the long-context phase). The long-context phase starts from phase 1's workdir (`init_from`: its parameters,
architecture, tokenizer and corpus, as configs/phase2.py) with the global layers' rotary base raised from 10k to
160k (the local layers keep 10k), 8,192-token rows, a constant lower rate, then a 1-sqrt decay over its last 50B
tokens; WORKDIR/export of either phase is a ModernBertForMaskedLM folder with the corpus's tokenizer.

Where this departs from the paper (the steps are its token counts over the batch's tokens):
- batch-size warmup (768 rows growing to the full batch over the first 50B/10B tokens) is not done: the full batch
  from step 0 (the warmup steps count that batch's tokens: 3B/2B tokens);
- the long phase's two parts (250B tokens constant, then 50B with the decay on upsampled higher-quality sources) are
  one run whose schedule is the same; the data mix is the corpus's;
- ModernBERT-large started from base's weights (center tiling) and lowered its learning rate after loss spikes;
  here large starts fresh at the paper's peak;
- on fewer chips keep the batch with --config.optim.grad_accum_steps, or scale batch_size, the learning rate and the
  steps together (and the warmup and decay steps, counted in steps).
"""
import ml_collections

from configs import base
from jbert.data import corpus

PAPER_WEIGHT_DECAY = 1e-5  # per step, fully decoupled: the paper's value for both sizes

# name: (layers, hidden, heads, FFN, peak lr, batch, steps, warmup steps, length)
SIZES = {
    # 3 layers: global, local, local, so both kinds train; a window of 16 inside 64-token rows.
    "tiny": (3, 128, 2, 192, 1e-3, 32, 600, 60, 64),
    # 1.719T tokens / (4,608 x 1,024) = 364,298 steps; 3B warmup tokens = 636 steps.
    "base": (22, 768, 12, 1152, 8e-4, 4608, 364_298, 636, 1024),
    # 1.719T tokens / (4,928 x 1,024) = 340,645 steps; 2B warmup tokens = 396 steps.
    "large": (28, 1024, 16, 2624, 5e-4, 4928, 340_645, 396, 1024),
}
# name: (phase-1 size, lr, batch, steps, decay steps, length, remat)
LONG = {
    "tiny_long": ("tiny", 3e-4, 8, 200, 40, 256, "none"),
    # 300B tokens / (72 x 8,192) = 508,626 steps, the last 50B (84,771 steps) decaying; 77 rows for large.
    "base_long": ("base", 3e-4, 72, 508_626, 84_771, 8192, "dots_no_batch"),
    "large_long": ("large", 5e-5, 77, 475_596, 79_266, 8192, "dots_no_batch"),
}
LOCAL_WINDOW = {"tiny": 16, "base": 128, "large": 128}


def get_config(arg=None):
  if arg not in SIZES and arg not in LONG:
    raise ValueError(f"configs/modernbert.py:{arg}: name a size or its long-context phase, one of "
                     f"{list(SIZES) + list(LONG)} (e.g. configs/modernbert.py:base).")
  size = LONG[arg][0] if arg in LONG else arg
  layers, hidden, heads, ffn, lr, batch, steps, warmup, length = SIZES[size]
  config = base.get_config()
  with config.unlocked():
    config.batch_size = batch                 # rows of `length` tokens per step (the paper: 4,608 / 4,928)
    config.total_steps = steps                # the paper's tokens over the batch's tokens (SIZES)
    config.model.preset = "base"
    config.model.model_type = "modernbert"    # the family's fields (jbert/model/families/modernbert.py) and its
                                              # export as transformers' ModernBert* classes
    config.model.num_hidden_layers = layers
    config.model.hidden_size = hidden
    config.model.num_attention_heads = heads
    config.model.intermediate_size = ffn      # the GeGLU's width: its input and gate are twice this
    # ModernBERT's tokenizer has 50,280 ids, its table 50,368 rows (a multiple of 64, for the matmuls); None: the
    # tokenizer's size (the tiny demo's generated vocabulary).
    config.model.vocab_size = None if size == "tiny" else 50_368
    config.model.max_position_embeddings = 8192  # longest sequence (rotary: no table); the long phase's length
    config.model.scan_layers = False          # pre-norm and two kinds of layer are unrolled (BertConfig)
    config.model.local_attention = LOCAL_WINDOW[size]  # sliding-window layers see local_attention // 2 each side
    config.model.rope_theta = 10_000.0        # the global layers' rotary base: 10k at 1,024 tokens, 160k after
    config.model.local_rope_theta = 10_000.0  # the sliding-window layers' rotary base, in both phases
    config.data.nsp = False                   # MLM only
    config.data.short_seq_prob = 0.0          # whole documents up to the length; shorter ones packed together
    config.data.max_seq_length = length
    config.data.masked_lm_prob = 0.3          # the paper's 30% (max_predictions_per_seq follows: 308 at 1,024)
    config.optim.name = "stable_adamw"
    config.optim.schedule = "wsd"             # warmup, the peak held, then (decay_steps) the decay
    config.optim.learning_rate = lr           # peak
    config.optim.warmup_steps = warmup        # 3B tokens (base), 2B (large)
    config.optim.decay_steps = 0              # phase 1 ends at its peak: the long-context phase continues it
    config.optim.b1 = 0.9
    config.optim.b2 = 0.98                    # the paper's betas (0.9, 0.98)
    config.optim.eps = 1e-6
    # 1e-5 per step at the peak; a reference, so --config.optim.learning_rate=X keeps the per-step decay.
    config.optim.weight_decay = ml_collections.FieldReference(PAPER_WEIGHT_DECAY) / config.optim.get_ref(
        "learning_rate")
    config.optim.decay_embeddings = False     # no decay on the embedding table (nor, as always, norms/biases)
    config.optim.grad_clip_norm = 0.0         # StableAdamW's update clipping instead
    if size == "tiny":
      config.log_every_steps = 50
      config.eval_every_steps = 200
      config.eval_batches = 4
      config.checkpoint_every_steps = 200
      config.model.dtype = "float32"          # CPUs compute bf16 slowly
      config.data.source = "synthetic"        # the generated corpus (its WordPiece vocabulary); a prepared BPE
      config.data.vocab = None                # corpus with --config.data.source=prepared --config.data.prepared
      config.data.worker_count = 0            # worker processes only slow a 2-core CPU down
    if arg in LONG:
      _, lr, batch, steps, decay, length, remat = LONG[arg]
      config.batch_size = batch               # 72 rows of 8,192 (77 for large)
      config.total_steps = steps
      config.data.max_seq_length = length
      config.data.max_predictions_per_seq = -(-3 * length // 10)  # 30% of the row: 2,458 at 8,192
      config.model.rope_theta = 160_000.0     # the global layers' base for 8,192 tokens (local layers: 10k)
      config.model.remat_policy = remat       # 8,192-token activations dominate memory
      config.optim.learning_rate = lr         # constant 3e-4 (large: 5e-5) ...
      config.optim.warmup_steps = 0
      config.optim.decay_steps = decay        # ... then 1-sqrt to 0 over the last 50B tokens
      config.optim.decay_shape = "1-sqrt"
      corpus.leave_to_init_from(config.data)  # phase 1's corpus and recipe, from init_from's workdir
  config.lock()
  return config
