"""The task contract (`jbert/tasks/base.py`): three composed roles, each with the abstract methods it needs, all
documented in base.py's docstring."""
from jbert.tasks import base, finetuning
from jbert.tasks.data import TaskData
from jbert.tasks.objective import Objective
from jbert.tasks.serving import Serving

ROLES = {Objective: {"batch_spec", "loss", "predictions"}, TaskData: {"train_stream", "eval_sets"},
         Serving: {"evaluate"}}


def test_the_contract_composes_three_roles_each_with_its_abstract_methods():
  assert base.Task.__bases__ == (Objective, TaskData, Serving)
  for role, methods in ROLES.items():
    assert role.__abstractmethods__ == methods, role
  assert base.Task.__abstractmethods__ == {"from_config"}.union(*ROLES.values())
  assert finetuning.FinetuneTask.__abstractmethods__ == base.Task.__abstractmethods__ - {
      "train_stream", "eval_sets"} | {"featurise", "records"}  # the data role in memory, and what serving reads
  assert finetuning.PredictingTask.__abstractmethods__ == finetuning.FinetuneTask.__abstractmethods__ | {
      "for_prediction", "read_inputs", "inputs_from"}


def test_every_abstract_method_is_documented_in_one_place():
  abstract = finetuning.PredictingTask.__abstractmethods__ | base.Task.__abstractmethods__
  missing = sorted(m for m in abstract if f"`{m}" not in base.__doc__)
  assert missing == []
  for module in ("objective.py", "data.py", "serving.py", "finetuning.py"):
    assert module in base.__doc__
