"""BERT-large pretraining, phase 1: the base recipe on the 24-layer, 1024-wide model with FSDP."""
from configs import base


def get_config(arg=None):
  config = base.get_config(arg)
  config.model.preset = "large"
  config.mesh.fsdp = -1                       # large's optimiser state (4 GiB) is better sharded than replicated
  config.mesh.data = 1
  return config
