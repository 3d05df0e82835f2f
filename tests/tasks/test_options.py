"""Options declared on a task class (`jbert.tasks.options`) and everything generated from them: jbert.predict's
flags and least values, the config section, the workdir record's evaluation-only keys; and no code outside
jbert/tasks/ naming a task's class, kind or options."""
import ast
import importlib
import pathlib
import types

from absl import flags
import pytest

from jbert import errors, tasks
from jbert.inference import cli
from jbert.inference.prediction import check_options
from jbert.tasks import options
from jbert.tasks.options import TaskOption
from jbert.tasks.question_answering import task as qa

PREDICTING = [cls for cls in tasks.TASKS.classes() if cls.predicts]


def test_an_option_reads_as_declared():
  stride = TaskOption("stride", 128, "tokens between windows", minimum=1)
  threshold = TaskOption("threshold", 0.0, "a threshold", evaluation_only=True)
  negative = TaskOption("negative", False, "may be empty", configured=False, default_help="the run's; else false")
  assert (stride.type, threshold.type, negative.type) == (int, float, bool)
  assert stride.flag_help(["question answering"]) == ("Question answering: tokens between windows (default: the "
                                                      "run's, else 128).")
  assert threshold.flag_help(["a", "b"]) == "A, b: a threshold (default: the run's, else 0)."
  assert negative.flag_help(["x"]) == "X: may be empty (default: the run's; else false)."
  assert options.config_section([stride, threshold, negative]) == {"stride": 128, "threshold": 0.0}
  assert options.defaults([stride, threshold, negative]) == {"stride": 128, "threshold": 0.0, "negative": False}


def test_one_name_is_one_option_across_classes():
  option = TaskOption("stride", 128, "tokens between windows", minimum=1)
  a = type("A", (), {"declared_options": (option,)})
  b = type("B", (), {"declared_options": (option,)})
  c = type("C", (), {"declared_options": (TaskOption("stride", 64, "tokens between windows"),)})
  assert options.collect([a, b]) == {"stride": (option, (a, b))}
  with pytest.raises(TypeError, match="^Task option 'stride' is declared differently by A and C; one name must be "
                                      "one option"):
    options.collect([a, c])


def test_question_answering_declares_its_settings_and_its_config_is_them():
  declared = {o.name: o for o in qa.QuestionAnswering.declared_options}
  assert list(declared) == ["doc_stride", "max_query_length", "n_best_size", "max_answer_length",
                            "null_score_diff_threshold", "version_2_with_negative"]
  assert qa.config_section() == {"doc_stride": 128, "max_query_length": 64, "n_best_size": 20,
                                 "max_answer_length": 30, "null_score_diff_threshold": 0.0}
  assert qa.PREDICTION_DEFAULTS == {**qa.config_section(), "version_2_with_negative": False}
  assert {n for n, o in declared.items() if o.evaluation_only} == {"n_best_size", "max_answer_length",
                                                                   "null_score_diff_threshold"}
  assert tasks.config_section("squad")["doc_stride"] == 128  # the training config's keys are the declared ones


def test_jbert_predict_flags_are_the_declared_options():
  predict = importlib.import_module("jbert.predict")
  declared = options.collect(PREDICTING)
  assert set(declared) >= {"doc_stride", "version_2_with_negative"}
  own = {f.name: f for f in flags.FLAGS.get_key_flags_for_module("jbert.predict")}
  for name, (option, owners) in declared.items():
    flag = own[name]
    assert flag.default is None and flag.help == option.flag_help(dict.fromkeys(c.title for c in owners))
    assert flag.flag_type() == {bool: "bool", int: "int", float: "float"}[option.type]
  assert own["doc_stride"].help == ("Question answering: tokens between the starts of a long context's windows "
                                    "(default: the run's, else 128).")
  assert own["null_score_diff_threshold"].help.endswith("(default: the run's, else 0).")
  # Least values: each declared minimum, with its help as the reason; none for the others.
  assert predict._MINIMUM == {n: (o.minimum, o.help) for n, (o, _) in declared.items() if o.minimum is not None}
  assert predict._MINIMUM["max_query_length"] == (1, "question tokens kept")


def test_a_declared_least_value_refuses_ints_and_floats_and_nan_is_refused():
  def holder(name, value):
    return types.SimpleNamespace(name=name, value=value)

  minimum = {"stride": (1, "tokens between windows"), "temperature": (0.5, "a softmax temperature")}
  with pytest.raises(errors.UserError, match=r"^--stride=0 must be at least 1 \(tokens between windows\)\.$"):
    cli.check_numbers(holder("stride", 0), minimum=minimum)
  with pytest.raises(errors.UserError, match=r"^--temperature=0.25 must be at least 0.5 \(a softmax temperature\)"):
    cli.check_numbers(holder("temperature", 0.25), minimum=minimum)
  with pytest.raises(errors.UserError, match="^--temperature=nan is not a number"):
    cli.check_numbers(holder("temperature", float("nan")), minimum=minimum)
  cli.check_numbers(holder("stride", 1), holder("temperature", 0.5), holder("other", -3), minimum=minimum)


def test_the_workdir_records_evaluation_keys_are_the_declared_ones():
  from jbert.train import workdir_record  # pylint: disable=import-outside-toplevel
  assert set(workdir_record.EVALUATION) == {"task.n_best_size", "task.max_answer_length",
                                            "task.null_score_diff_threshold"}
  assert workdir_record.EVALUATION == options.evaluation_keys(tasks.TASKS.classes())
  assert set(workdir_record.EVALUATION) <= set(workdir_record.SAFE) & set(workdir_record.OUTPUT)


def test_prediction_settings_are_checked_against_the_declarations():
  classifier = tasks.SequenceClassification
  with pytest.raises(TypeError, match="^Unknown prediction setting.s. stride; use max_length or doc_stride, "):
    check_options({"stride": 3}, classifier, "BertForSequenceClassification")
  with pytest.raises(ValueError, match="^doc_stride applies to question answering; this model is a Bert"):
    check_options({"doc_stride": 3}, classifier, "BertForSequenceClassification")
  check_options({"doc_stride": 3, "max_length": 64}, qa.QuestionAnswering, "BertForQuestionAnswering")


def test_what_serving_asks_of_a_task_is_declared_on_it():
  assert tasks.SequenceClassification.one_sequence_per_input and tasks.CrossEncoder.one_sequence_per_input
  assert not qa.QuestionAnswering.one_sequence_per_input and not qa.QuestionAnswering.scores_pairs
  assert not tasks.MultipleChoice.one_sequence_per_input and not tasks.TokenClassification.scores_pairs
  regressor = object.__new__(tasks.SequenceClassification)
  regressor.regression = True
  classifier = object.__new__(tasks.SequenceClassification)
  classifier.regression = False
  assert regressor.scores_pairs and not classifier.scores_pairs


# jbert/model/ names its heads (a head kind may equal a task kind: that is the head's name).
_OWN_NAMES = ("jbert/tasks/", "jbert/model/")


def test_no_code_outside_jbert_tasks_names_a_tasks_class_kind_or_options():
  classes = tasks.TASKS.classes()
  declared = set(options.collect(classes))
  words = {k for cls in classes for k in cls.kinds} | declared
  class_names = {cls.__name__ for cls in classes}
  package = pathlib.Path(tasks.__file__).resolve().parents[1]
  found = []
  for path in sorted(package.rglob("*.py")):
    where = path.relative_to(package.parent).as_posix()
    if where.startswith(_OWN_NAMES):
      continue
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    for node in ast.walk(tree):
      if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
        if node.value.removeprefix("task.") in words:
          found.append(f"{where}:{node.lineno} {node.value!r}")
      elif isinstance(node, (ast.Name, ast.Attribute)):
        name = node.id if isinstance(node, ast.Name) else node.attr
        if name in class_names or name in declared:  # a kind's word as a variable (`cross_encoder`) is fine
          found.append(f"{where}:{node.lineno} {name}")
      elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jbert.tasks"):
        found += [f"{where}:{node.lineno} imports {a.name}" for a in node.names if a.name in class_names]
  assert found == []
  assert {"doc_stride", "question_answering", "regression"} <= words  # the scan knows what to look for
