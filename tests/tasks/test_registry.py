"""The task registry: each task module registers its class; config names, `local`'s kinds and a model folder's
task are looked up in it, never by kind strings elsewhere; a new task is one module."""
import json
import pathlib
import re
import types

import ml_collections
import pytest

import jbert
from jbert import tasks
from jbert.model import registry as heads
from jbert.tasks import base, finetuning, registry
from jbert.weights import ModelInfo

JBERT = pathlib.Path(jbert.__file__).parent


def _folder(head_cls, *, num_labels=None, task=None, path="model", run_config=None):
  info = ModelInfo(jbert.BertConfig(max_position_embeddings=64), heads.head(head_cls), num_labels, None, "hf", task)
  return types.SimpleNamespace(path=str(path), info=info, run_config=run_config, run_config_from=None)


def test_the_registrations_name_every_kind_once_in_the_modules_order():
  assert tasks.TASKS.kinds() == ("classification", "regression", "ner", "ner_crf", "question_answering",
                                 "multiple_choice", "cross_encoder", "sts_cosine", "nli_softmax", "mnrl", "triplet",
                                 "distillation", "pretraining", "electra_pretraining")
  assert tasks.TASKS.local_kinds() == ("classification", "ner", "multiple_choice")
  assert tasks.TASKS.get("cross_encoder") is tasks.CrossEncoder
  assert issubclass(tasks.CrossEncoder, tasks.SequenceClassification)  # a real subclass, no loss_kind branches
  assert tasks.TASKS.for_config_name("stsb") is tasks.SequenceClassification  # a dataset: its kind's class
  assert tasks.TASKS.for_config_name("cross_encoder") is tasks.CrossEncoder  # a class's own name
  assert tasks.TASKS.for_config_name("local", "ner") is tasks.TokenClassification
  assert tasks.TASKS.for_config_name("nonsense") is None
  assert tasks.TASKS.for_config_name("distill").kinds == ("distillation",)  # configs/finetune.py:distill
  assert "cross_encoder" in tasks.TASKS.config_names() and "pretraining" not in tasks.TASKS.config_names()
  with pytest.raises(ValueError, match=r"unknown task kind 'crf'; one of classification, regression, ner"):
    tasks.TASKS.get("crf")


def test_no_module_outside_the_tasks_switches_on_kind_strings():
  """Only the task modules and the datasets' table name kinds (heads share some names as their command-line keys,
  CoNLL-2003 its tag field's)."""
  kinds = "|".join(k for k in tasks.TASKS.kinds() if k != "pretraining")  # also what configs without a task train
  pattern = re.compile(rf"""["']({kinds})["']""")
  found = [f"{path.relative_to(JBERT)}:{n}" for path in sorted(JBERT.rglob("*.py"))
           if path.relative_to(JBERT).parts[0] != "tasks" and "finetune" not in path.parts
           for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
           if pattern.search(line.split("#")[0]) and "registry.register(" not in line]
  assert found == []


def test_a_new_task_module_registers_itself_and_a_clash_is_refused():
  table = registry.Registry()

  @table.register
  class Tagger(finetuning.PredictingTask):  # pylint: disable=abstract-method,unused-variable
    kinds = ("crf_ner",)
    config_names = ("crf_tagger",)
    local_kind = "crf_ner"
    head = heads.head(jbert.BertForTokenClassification)

  assert table.kinds() == ("crf_ner",) and table.for_config_name("crf_tagger") is Tagger
  assert table.for_config_name("local", "crf_ner") is Tagger and table.local_kinds() == ("crf_ner",)
  assert table.for_head("BertForTokenClassification") == (Tagger,)
  with pytest.raises(ValueError, match=r"task kind 'crf_ner' of .*Other is already registered by .*Tagger"):
    table.register(type("Other", (Tagger,), {}))
  with pytest.raises(ValueError, match=r"task\.kind='span'; local files are crf_ner\."):
    table.for_config_name("local", "span")


def test_a_variant_module_adds_its_keys_to_its_kinds_configs_and_trains_those_that_select_it():
  """A CRF over NER's tags is one module: `variant_of` the NER kind, chosen by its own key, which joins the
  sections of every config that trains NER (`local` too); without it the NER class trains as before."""
  table = registry.Registry()
  table.register(tasks.SequenceClassification)
  table.register(tasks.TokenClassification)

  @table.register
  class CrfTagger(tasks.TokenClassification):  # pylint: disable=unused-variable
    kinds = ("ner_crf",)
    local_kind = None
    variant_of = "ner"

    @classmethod
    def variant_keys(cls):
      return {"crf": False}

    @classmethod
    def selects(cls, task_cfg):
      return bool(task_cfg.get("crf"))

  for name in ("conll2003", "local"):
    assert list(table.config_section(name))[-1] == "crf" and table.config_section(name)["crf"] is False
  assert "crf" not in table.config_section("sst2")
  config = lambda **task: ml_collections.ConfigDict({"name": "local", "kind": "ner", **task})
  assert table.for_config(config(crf=True)) is CrfTagger
  assert table.for_config(config(crf=False)) is tasks.TokenClassification
  assert table.for_config(config(kind="classification", crf=True)) is tasks.SequenceClassification
  assert table.for_head("BertForTokenClassification") == (tasks.TokenClassification,)  # recorded kind only


def test_a_model_is_served_by_its_recorded_kind_else_by_its_head(tmp_path):
  served = lambda folder: tasks.for_model(folder)  # (class, kind) or None
  classifier = jbert.BertForSequenceClassification
  # Recorded by jbert: the kind wins, also where the head alone would say another.
  assert served(_folder(classifier, num_labels=1, task="cross_encoder")) == (tasks.CrossEncoder, "cross_encoder")
  assert served(_folder(classifier, num_labels=3, task="classification")) == (tasks.SequenceClassification,
                                                                              "classification")
  # Foreign folders: the head, a one-label classifier read as transformers reads it (a regressor) ...
  assert served(_folder(classifier, num_labels=1)) == (tasks.SequenceClassification, "regression")
  assert served(_folder(classifier, num_labels=2)) == (tasks.SequenceClassification, "classification")
  assert served(_folder(jbert.BertForTokenClassification, num_labels=5, task="a_kind_from_elsewhere")) == (
      tasks.TokenClassification, "ner")
  # ... unless sentence-transformers marked it as a CrossEncoder, or a cross_encoder run wrote it.
  (tmp_path / "config_sentence_transformers.json").write_text(json.dumps({"model_type": "CrossEncoder"}))
  assert served(_folder(classifier, num_labels=1, path=tmp_path)) == (tasks.CrossEncoder, "cross_encoder")
  assert served(_folder(classifier, num_labels=1, run_config={"task": {"name": "cross_encoder"}})) == (
      tasks.CrossEncoder, "cross_encoder")
  # Nothing predicts with a bi-encoder's or a pretraining head.
  assert served(_folder(jbert.BertModel, task="mnrl")) is None
  assert served(_folder(jbert.BertForPreTraining)) is None


def test_the_recorded_kind_round_trips_through_config_json(tmp_path):
  config = jbert.BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=32, max_position_embeddings=16)
  record = jbert.weights.model_config_dict(config, jbert.BertForTokenClassification, 3, ("O", "B-X", "I-X"),
                                           task="ner")
  assert record["jbert"] == {"task": "ner"} and record["architectures"] == ["BertForTokenClassification"]
  info = jbert.weights.info_from_config(json.loads(json.dumps(record)), "hf")
  assert (info.head, info.num_labels, info.label_names, info.kind, info.task) == (
      heads.head(jbert.BertForTokenClassification), 3, ("O", "B-X", "I-X"), "hf", "ner")
  assert jbert.weights.info_from_config({**record, "jbert": "garbled"}, "hf").task is None


def _task_section(name, **keys):
  """configs/finetune.py:NAME's `task` section with `keys` set."""
  section = ml_collections.ConfigDict(tasks.config_section(name))
  section.update(keys)
  return section


@pytest.mark.parametrize("name, keys, message", [
    ("local", {"crf": True},
     "task.crf=True does nothing for task local with task.kind=classification (sequence classification): it is not "
     "one of its settings. task.crf is read by named-entity recognition with a CRF (conll2003, local with "
     "task.kind=ner). Drop it, or train a task that reads it."),
    ("local", {"kind": "ner", "crf_scheme": "iob2"},
     "task.crf_scheme='iob2' does nothing for task local with task.kind=ner (named-entity recognition): it is not "
     "one of its settings. task.crf_scheme is read by named-entity recognition with a CRF (conll2003, local with "
     "task.kind=ner). Drop it, or train a task that reads it."),
    ("local", {"kind": "ner", "text_a": "sentence"},
     "task.text_a='sentence' does nothing for task local with task.kind=ner (named-entity recognition): NER reads "
     "words and tags, not columns (task.label_names names the tags). task.text_a is read by sequence "
     "classification (local with task.kind=classification), cross-encoder (cross_encoder), distillation (distill), "
     "mnrl (mnrl), nli_softmax (nli_softmax), sts_cosine (sts_cosine) and 1 more. Drop it, or train a task that "
     "reads it."),
    ("sst2", {"kind": "ner"},
     "task.kind='ner' does nothing for task sst2 (sequence classification): task.kind picks the task of `local` "
     "files only. task.kind is read by sequence classification (local with task.kind=classification), named-entity "
     "recognition (local with task.kind=ner), multiple choice (local with task.kind=multiple_choice). Drop it, or "
     "train a task that reads it."),
    ("sst2", {"train_file": "train.csv"},
     r"task.train_file='train.csv' does nothing for task sst2 (sequence classification): sst2 reads TFDS's "
     "glue/sst2 (your own files train `local`). task.train_file is read by sequence classification (local with "
     "task.kind=classification), "),
    ("conll2003", {"eval_file": "dev.txt"},
     "task.eval_file='dev.txt' does nothing for task conll2003 (named-entity recognition): conll2003 reads TFDS's "
     "splits unless task.train_file is set. task.eval_file is read by named-entity recognition (local with "
     "task.kind=ner), "),
    ("local", {"kind": "multiple_choice", "label_names": "a,b"},
     "task.label_names='a,b' does nothing for task local with task.kind=multiple_choice (multiple choice): multiple "
     "choice reads `context`, `endings` and `label` (JSONL) or SWAG's columns, named by no key. "),
    ("local", {"tfds_data_dir": "/data"},
     "task.tfds_data_dir='/data' does nothing for task local with task.kind=classification (sequence "
     "classification): its data are local files (task.train_file, ...), not TFDS. task.tfds_data_dir is read by "
     "sequence classification (cola, "),
])
def test_a_key_the_chosen_task_does_not_read_is_refused_naming_who_reads_it(name, keys, message):
  with pytest.raises(ValueError) as error:
    tasks.TASKS.check_keys(_task_section(name, **keys))
  assert str(error.value).startswith(message), str(error.value)


def test_keys_the_task_reads_or_left_at_their_defaults_pass():
  for name in tasks.TASKS.config_names():  # every config as configs/finetune.py makes it
    tasks.TASKS.check_keys(_task_section(name))
  for name, keys in [("local", {"crf": False, "kind": "classification", "text_a": "a", "regression": True}),
                     ("local", {"kind": "ner", "crf": True, "crf_scheme": "io", "label_names": "O,PER"}),
                     ("conll2003", {"crf": True, "train_file": "t.txt", "eval_file": "d.txt"}),
                     ("sst2", {"tfds_data_dir": "/data", "kind": "classification"}),
                     ("hellaswag", {"train_file": "t.jsonl", "eval_file": "d.jsonl"}),
                     ("squad", {"train_file": "t.json", "doc_stride": 64}),
                     ("cross_encoder", {"loss": "mse", "text_a": "q"})]:
    tasks.TASKS.check_keys(_task_section(name, **keys))


def test_a_class_declares_the_datasets_it_trains_by_name():
  """A dataset is declared on its class (`Task.datasets`, the family's sources.py): its name trains the class of
  its kind, and every named dataset is listed, with no table of them outside the task packages."""
  from jbert.tasks.sources import Dataset  # pylint: disable=import-outside-toplevel
  table = registry.Registry()
  corpus = Dataset(name="my_corpus", kind="tagging", tfds_name="my_corpus", splits={"train": "train"},
                   eval_splits=(), text_keys=("tokens",), label_key="tags", num_labels=2, label_names=("O", "X"),
                   metrics=("f1",), features=lambda *a, **k: {})

  @table.register
  class Tagger(finetuning.PredictingTask):  # pylint: disable=abstract-method,unused-variable
    kinds = ("tagging",)
    datasets = {"my_corpus": corpus}
    head = heads.head(jbert.BertForTokenClassification)

  assert table.for_config_name("my_corpus") is Tagger and table.datasets() == {"my_corpus": corpus}
  assert table.dataset("my_corpus") is corpus and "my_corpus" in table.config_names()
  with pytest.raises(ValueError, match=r"^unknown task 'my-corpus'; known tasks: my_corpus "):
    table.dataset("my-corpus")
  # jbert's own: each family's package declares its datasets; the registry gathers them.
  glue = tasks.TASKS.datasets()
  assert glue["mrpc"] is tasks.SequenceClassification.datasets["mrpc"] and glue["squad_v2"].kind == "question_answering"
  assert not any(path.name == "datasets.py" for path in (JBERT / "data").rglob("*.py"))
