"""Logical names of the activation axes, shared by the layers and the attention kernels (docs/ARCHITECTURE.md)."""

BATCH, LENGTH, EMBED = "activation_batch", "activation_length", "activation_embed"
HEADS, KV, MLP = "activation_heads", "activation_kv", "activation_mlp"
# Output axis of the H x H kernels outside the layers (the pooler, the MLM head's transform). It is not `mlp`, so
# that the feed-forward block can be sharded without them; jbert.runtime.sharding maps it like `mlp`.
TRANSFORM = "transform"
