r"""Train BERT: pretraining and fine-tuning, one command, from one CPU to a TPU pod slice.

  python run.py --config=configs/NAME.py[:ARG] --workdir=DIR [--config.KEY=VALUE ...]

Pretraining (masked LM + next sentence) on a generated corpus or your text files:
  python run.py --config=configs/tiny.py --workdir=/tmp/jbert_tiny
  python run.py --config=configs/base.py --workdir=DIR --config.data.source=text --config.data.text_files='*.txt'

Fine-tuning a checkpoint on a GLUE/SQuAD/NER/multiple-choice task, or your own labelled CSV/TSV/JSONL files:
  python run.py --config=configs/finetune.py:sst2 --workdir=DIR --config.init_from=CHECKPOINT
  python run.py --config=configs/finetune.py:local --workdir=DIR --config.init_from=CHECKPOINT \
      --config.task.train_file=train.csv --config.task.eval_file=dev.csv --config.task.text_a=sentence \
      --config.task.label=label --config.task.label_names=neg,pos

Every key of the config file is a flag, --config.KEY=VALUE; the config files document them. A key whose default
is None, or that the config declares optional, takes --config.KEY=None. Running the same command again resumes
from the latest checkpoint in DIR/checkpoints (a finished run says it is complete).
Ctrl-C, like SIGTERM, finishes the step, saves a checkpoint and exits (at once while the programs compile); a
second Ctrl-C aborts at once. The
XLA programs a run compiles are kept in ~/.cache/jbert/xla (--compile_cache=PATH|off, or $JBERT_COMPILE_CACHE),
so a rerun or a resume loads them instead of compiling again.

A mistake the user can fix (a missing flag, a mistyped key, a value out of range, a data file that is missing
or not text, a busy workdir, a full disk) is one line on stderr naming it and the fix, exit status 2; those
found before training create nothing. A config that differs from the one that trained DIR (DIR/config.json)
is refused the same way, naming each key, old and new; --config.allow_changes=KEY,... makes a change deliberate.
JBERT_TRACEBACK=1 shows the traceback instead, for bug reports.
"""
import difflib
import importlib.util
import logging
import os
import re
import shlex
import sys
from typing import NoReturn

from absl import app
from absl import flags
import ml_collections
from ml_collections import config_flags

from jbert import errors
from jbert.runtime import storage_failures

USAGE = "usage: python run.py --config=configs/NAME.py[:ARG] --workdir=DIR [--config.KEY=VALUE ...]"

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "configs/NAME.py[:ARG]: pretraining (tiny, base, large, phase2:PHASE1) or finetune.py:TASK.",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics.jsonl and TensorBoard logs.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "HOST:PORT of process 0 (CPU multi-process).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes taking part (found on TPU VMs).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index (found on TPU VMs).")
_COMPILE_CACHE = flags.DEFINE_string(
    "compile_cache", None, "Directory (or gs:// URL) of the persistent XLA compile cache, or `off`. Default: "
    "$JBERT_COMPILE_CACHE, else ~/.cache/jbert/xla ($XDG_CACHE_HOME/jbert/xla).")

_OVERRIDE = re.compile(r"^--?(?:no)?config\.([^=]+)")


def _fail(message: str, usage: bool = False) -> NoReturn:
  print(f"run.py: {message}" + (f"\n{USAGE}" if usage else ""), file=sys.stderr, flush=True)
  sys.exit(errors.EXIT_STATUS)


def _flag_value(argv: list[str], name: str) -> str | None:
  """The value of `--name=VALUE` or `--name VALUE` in `argv` (the last one given), else None."""
  value = None
  for i, arg in enumerate(argv):
    if re.fullmatch(rf"--?{name}", arg) and i + 1 < len(argv):
      value = argv[i + 1]
    elif re.match(rf"--?{name}=", arg):
      value = arg.split("=", 1)[1]
  return value


def _load_config(spec: str) -> ml_collections.ConfigDict:
  """The config `--config=PATH[:ARG]` names, or one line saying why there is none."""
  path = spec.split(":", 1)[0]
  if not os.path.isfile(path):
    here = [f"configs/{f}" for f in sorted(os.listdir("configs"))] if os.path.isdir("configs") else []
    here = [f for f in here if f.endswith(".py") and not os.path.basename(f).startswith("_")]
    _fail(f"--config={spec}: no config file {path} (relative to {os.getcwd()})" +
          (f"; the configs here are {', '.join(here)}." if here else "."))
  try:
    module_spec = importlib.util.spec_from_file_location("run_config", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    config = module.get_config(*spec.split(":", 1)[1:])
  except Exception as e:  # pylint: disable=broad-except  (the config's own code failed: its message, one line)
    reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
    _fail(f"--config={spec}: loading it failed: {reason}")
  if not isinstance(config, ml_collections.ConfigDict):
    _fail(f"--config={spec}: get_config() returned {type(config).__name__}, not a ConfigDict.")
  return config


def _unknown_key(config: ml_collections.ConfigDict, key: str) -> tuple[str, list[str]] | None:
  """(the part of `key` that does not exist, the keys at that level) or None when `key` exists."""
  node, prefix = config, ""
  for part in key.split("."):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      level = node if isinstance(node, ml_collections.ConfigDict) else ml_collections.ConfigDict()
      keys = [prefix + k + (".*" if isinstance(level[k], ml_collections.ConfigDict) else "") for k in level]
      return prefix + part, sorted(keys)
    node, prefix = node[part], f"{prefix}{part}."
  return None


def _check_overrides(spec: str, config: ml_collections.ConfigDict, argv: list[str]) -> None:
  """A mistyped `--config.KEY` is named with the keys of the config actually loaded, nearest first."""
  for arg in argv:
    match = _OVERRIDE.match(arg)
    unknown = _unknown_key(config, match.group(1)) if match else None
    if unknown:
      missing, keys = unknown
      near = difflib.get_close_matches(missing, [k.removesuffix(".*") for k in keys], n=3, cutoff=0.6)
      hint = f' Did you mean "{near[0]}"?' if near else ""
      ordered = sorted(keys, key=lambda k: k.removesuffix(".*") not in near)  # stable: the near ones first
      listing = f" Its keys: {', '.join(ordered)}." if ordered else f" {missing.rpartition('.')[0]} is a value."
      _fail(f"invalid config override {arg}: {spec} has no key {missing}.{hint}{listing}")


# What a key that takes no None takes instead, by its type, for the message that refuses None.
_TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string", list: "a list",
               tuple: "a list"}


def _field(config: ml_collections.ConfigDict, key: str) -> tuple[ml_collections.ConfigDict, str]:
  """(the section holding dotted `key`, the key's last part)."""
  *parents, last = key.split(".")
  for part in parents:
    config = config[part]
  return config, last


def _may_be_none(config: ml_collections.ConfigDict, key: str) -> bool:
  """Whether `key` takes None: its value in the config file is None, or the config declares it optional, a
  FieldReference with its type, which a locked config needs for a key that may be None (optim.warmup_steps,
  model.preset). The data keys that others are computed from, or that are computed, are references for that
  reason and refuse None in `jbert.train.ranges`."""
  section, last = _field(config, key)
  field = section._fields[last]  # pylint: disable=protected-access  (the declaration, not its value)
  return section[last] is None or isinstance(field, ml_collections.FieldReference)


def _none_overrides(spec: str, config: ml_collections.ConfigDict, argv: list[str]) -> tuple[list[str], list[str]]:
  """`--config.KEY=None` (or `--config.KEY None`) taken out of `argv`, since absl's parsers read it as a number,
  a bool or the text "None". Returns the other arguments and the keys to set to None once they parse (a key's last
  override wins, as absl's do); a key that takes no None ends the command in one line."""
  kept, nones = [], []
  i = 0
  while i < len(argv):
    arg, match = argv[i], _OVERRIDE.match(argv[i])
    key = match.group(1) if match and not re.match(r"--?noconfig\.", arg) else None
    value, width = (arg.split("=", 1)[1] if "=" in arg else None), 1
    if key is not None and value is None and argv[i + 1:i + 2] == ["None"]:
      value, width = "None", 2
    if key is not None:
      nones = [k for k in nones if k != key]
    if key is not None and value == "None":
      if not _may_be_none(config, key):
        section, last = _field(config, key)
        current = section[last]
        _fail(f"invalid config override {' '.join(argv[i:i + width])}: {key} cannot be None in {spec}; give it "
              f"{_TYPE_NAMES.get(type(current), 'a value')} ({spec} has {errors.preview(current)}).")
      nones.append(key)
    else:
      kept += argv[i:i + width]
    i += width
  return kept, nones


def parse_flags(argv: list[str]) -> list[str]:
  """absl parsing with every command-line mistake reported in one line (the usage line added where the
  command is incomplete), before anything is created."""
  args = argv[1:]
  if any(re.fullmatch(r"--?(help|helpfull|helpshort|\?)|-h", a) for a in args):
    try:
      return flags.FLAGS(argv)  # absl prints the help and exits
    except SystemExit:
      sys.exit(0)  # absl's status 1 would say the help was an error
  spec, workdir = _flag_value(args, "config"), _flag_value(args, "workdir")
  missing = [name for name, value in (("--config", spec), ("--workdir", workdir)) if not value]
  if missing:
    _fail(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} required.", usage=True)
  config = _load_config(spec)
  _check_overrides(spec, config, args)
  argv, nones = _none_overrides(spec, config, argv)
  try:
    parsed = flags.FLAGS(argv)
  except (flags.Error, AttributeError, KeyError, TypeError, ValueError, OSError) as e:
    message = " ".join(str(e).replace("\\n", " ").replace("\\", "").split())
    _fail(f"invalid flag or config override: {message}")
  for key in nones:
    section, last = _field(_CONFIG.value, key)
    section[last] = None
  return parsed


def _finished(config: ml_collections.ConfigDict, workdir: str) -> str | None:
  """What to say instead of training when the workdir already reached `config.total_steps`; a config other than
  the one that trained it raises first. Creates nothing; with total_steps None (epochs) the trainer decides."""
  if config.get("total_steps") is None:
    return None
  from jbert.train import plan  # pylint: disable=g-import-not-at-top
  from jbert.train import ranges  # pylint: disable=g-import-not-at-top
  from jbert.train import workdir_record  # pylint: disable=g-import-not-at-top
  ranges.check_ranges(config)  # a value out of range is named as such, before it is compared with the workdir's
  resolved = plan.resolve(config, workdir)  # as the trainer will: an unset model.scan_layers is no change
  return workdir_record.finished_message(workdir, resolved, workdir_record.check(workdir, resolved))


def main(argv):
  if len(argv) > 1:
    _fail(f"unexpected arguments {argv[1:]}; every setting is a flag (--workdir=DIR, --config.KEY=VALUE).", usage=True)
  from jbert.runtime import ahead  # pylint: disable=g-import-not-at-top
  # A stopped or failed run leaves now, not once the compiles it no longer needs are done.
  ahead.then_leave(lambda: execute(_CONFIG.value, _WORKDIR.value, _COORDINATOR.value, _NUM_PROCESSES.value,
                                   _PROCESS_ID.value, compile_cache=_COMPILE_CACHE.value,
                                   command=shlex.join(["python", *sys.argv])))


def execute(config: ml_collections.ConfigDict, workdir: str, coordinator_address: str | None = None,
            num_processes: int | None = None, process_id: int | None = None, *, compile_cache: str | None = None,
            command: str | None = None) -> None:
  """What the command does once its flags parse: a user's mistake ends it with one line on stderr and exit
  status 2 (`errors.is_user_error`); a bug, or any error under JBERT_TRACEBACK=1, raises with its traceback.
  `command` is the command line a stopped run (SIGTERM, Ctrl-C) names for its resume."""
  # A storage failure is reported in one line: the storage clients' own tracebacks of it stay off the console.
  with errors.reported("run.py"), storage_failures.library_tracebacks_off():
    _train(config, workdir, coordinator_address, num_processes, process_id, compile_cache, command)


def _train(config, workdir, coordinator_address, num_processes, process_id, compile_cache, command) -> None:
  """Resumes, trains and evaluates, or says the run in `workdir` is already complete."""
  from jbert.runtime import storage  # pylint: disable=g-import-not-at-top
  storage.require_config(config, workdir, compile_cache)  # a gs:// path this install cannot open: one line, now
  from jbert.checkpoint import writable  # pylint: disable=g-import-not-at-top
  writable.check_reachable(workdir)  # a gs:// workdir whose storage is down: one line, after one read's retries
  from jbert.runtime import console  # pylint: disable=g-import-not-at-top
  console.quiet_library_logs()
  if (num_processes or 1) > 1:
    console.drop_gloo_lines()
  from jbert import distributed  # pylint: disable=g-import-not-at-top  (JAX must not start before flags parse)
  distributed.initialize(coordinator_address, num_processes, process_id)
  logging.getLogger("jbert").setLevel(logging.INFO)
  logging.getLogger("absl").setLevel(logging.WARNING)  # Orbax logs every file it writes at INFO.
  from jbert.runtime import compile_cache as cache  # pylint: disable=g-import-not-at-top
  cache.enable(compile_cache)  # before the first compile: a rerun or a resume loads what an earlier run compiled
  finished = _finished(config, workdir)
  if finished:
    import jax  # pylint: disable=g-import-not-at-top
    if jax.process_index() == 0:
      print(finished, flush=True)
    return
  from jbert.train import trainer as train  # pylint: disable=g-import-not-at-top
  train.train_and_evaluate(config, workdir, command=command)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
