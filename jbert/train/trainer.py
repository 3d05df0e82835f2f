"""`train_and_evaluate(config, workdir)`: one trainer for pretraining and every fine-tuning task, 1 CPU to a pod.

Reads top-down: configuration (`jbert.train.plan`: tokenizer, model, mesh, data shards, the task and its data,
all checked before anything is written or compiled) → jitted steps (`jbert.train.programs`) → state (resume,
init_from or fresh: `jbert.train.start`) → evaluation and outputs → the loop (log, evaluate, checkpoint, stop on
preemption or a non-finite step). What differs between tasks lives in `jbert.tasks`.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np

from jbert.train import architecture
from jbert.train import best as best_lib
from jbert.checkpoint import manager as ckpt_lib
from jbert.checkpoint import writable
from jbert.train import evaluation
from jbert.runtime import flops as flops_lib
from jbert.runtime import metrics as metrics_lib
# The plan's and the programs' names are the trainer's too: run.py, tpu/aot_compile.py and tests use them.
from jbert.train.programs import Steps, build_steps  # noqa: F401
from jbert.train.plan import DataShards, Run, check_cadences, check_model, data_shards, plan, resolve_length, resolve_scan_layers  # noqa: F401,E501
from jbert.runtime import ahead as ahead_lib
from jbert.runtime import atomic
from jbert.runtime import compile_cache
from jbert.runtime import sharding
from jbert.runtime import storage_failures
from jbert.train.start import initial_state
from jbert.train.stop import StopRequest
from jbert.train import workdir_record
from jbert.checkpoint import lock as workdir_lock
from jbert.model import registry
from jbert.model.validation import check_ids
from jbert.errors import UserError

log = logging.getLogger("jbert")


class TrainingError(RuntimeError, UserError):
  """The run cannot go on; the message says why and what to do (run.py: one line, exit status 2)."""


# ----------------------------------------------------------------------------------------------------------
# Configuration: `jbert.train.plan` checks everything before anything is written or compiled.
# ----------------------------------------------------------------------------------------------------------

def _every(step: int, cadence: int, total: int) -> bool:
  return step == total or (cadence > 0 and step % cadence == 0)


# ----------------------------------------------------------------------------------------------------------
# State: resume → init_from → fresh (`jbert.train.start.initial_state`); a workdir of another task refused.
# ----------------------------------------------------------------------------------------------------------


def check_resumable(run: Run, ckpt: ckpt_lib.Checkpointer) -> None:
  """Refuses, before compiling, a workdir whose checkpoint holds another head or another number of labels."""
  step = ckpt.latest_step()
  if step is None:
    return
  recorded = ckpt.read_json(step, "bert_config")
  want = run.task.head.architecture
  have = (recorded.get("architectures") or [want])[0]
  # Recorded under the family's transformers name (ElectraForPreTraining is BertForReplacedTokenDetection).
  head = registry.by_architecture([have])
  labels = recorded.get("num_labels")
  other_labels = run.task.head.labelled and labels not in (None, run.task.num_labels)
  if (head.architecture if head else have) != want or other_labels:
    raise TrainingError(
        f"{ckpt.directory}/{step} holds a {have} with num_labels={labels}, but this run trains a {want} with "
        f"num_labels={run.task.num_labels}: a workdir belongs to one task. Use a fresh --workdir (pass this one "
        "as --config.init_from to start from its weights).")


def model_record(run: Run) -> dict[str, Any]:
  """What checkpoints record about the model, so `load_pretrained`/`convert`/`predict` never guess."""
  from jbert import weights  # pylint: disable=g-import-not-at-top
  return weights.model_config_dict(run.bert_config, run.task.head.cls, run.task.num_labels, run.task.label_names,
                                   full=True, task=run.task.kind)


# ----------------------------------------------------------------------------------------------------------
# Evaluation and the outputs of a finished run.
# ----------------------------------------------------------------------------------------------------------


def write_export(run: Run, params, workdir: str) -> str:
  """WORKDIR/export (`Task.export`), and beside it each folder of that export the task names in `export_beside`
  (ELECTRA's generator: WORKDIR/export_generator); each folder written whole (`atomic.folder_for_write`), the
  ones beside first. Returns the export's path."""
  export = os.path.join(workdir, "export")
  with atomic.folder_for_write(export) as folder:
    run.task.export(run.bert_config, params, folder, run.tokenizer)
    for part, name in run.task.export_beside.items():
      with atomic.folder_for_write(os.path.join(workdir, name)) as target:
        shutil.copytree(os.path.join(folder, part), target, dirs_exist_ok=True)
      shutil.rmtree(os.path.join(folder, part))
  return export


def eval_batch_size(config) -> int:
  return config.get("eval_batch_size") or config.batch_size


def packed_eval(task) -> dict[str, int]:
  """`evaluation.predict`'s packing arguments for a task whose batches are packed; none otherwise."""
  slots = task.eval_slots()
  return {} if slots is None else {"slots": slots, "pad_id": task.pad_id}


def eval_shapes(task, eval_sets, batch: int) -> list[dict]:
  """The batch shapes of the evaluation's predict programs: what compiles ahead."""
  packed = packed_eval(task)
  if packed:
    return [s for e in eval_sets for s in evaluation.packed_shapes(e.features, global_batch_size=batch,
                                                                    slots=packed["slots"])][:1]
  return [s for e in eval_sets for s in evaluation.bucketed_shapes(
      e.features, task.predict_keys, global_batch_size=batch, buckets=task.buckets())]


def evaluate(run: Run, steps: Steps, params, eval_sets, *, labelled_only: bool = True) -> tuple[dict, dict]:
  """({split: metrics}, {split: predictions}) over the evaluation sets (every split when not labelled_only)."""
  results, predictions = {}, {}
  batch = eval_batch_size(run.config)
  for eval_set in eval_sets:
    if labelled_only and not eval_set.labelled:
      continue
    raw = evaluation.predict(steps.predict, params, eval_set.features, run.task.predict_keys,
                             global_batch_size=batch, sharding=steps.data_sharding, buckets=run.task.buckets(),
                             token_outputs=run.task.token_outputs, **packed_eval(run.task))
    predictions[eval_set.name] = run.task.decode(eval_set, raw)
    if eval_set.labelled:
      results[eval_set.name] = run.task.evaluate(eval_set, predictions[eval_set.name])
  return results, predictions


def eval_scalars(results: dict[str, dict[str, float]]) -> dict[str, float]:
  """`eval/<metric>` for one evaluation split, `eval/<split>/<metric>` for several."""
  prefix = (lambda split: "eval/") if len(results) == 1 else (lambda split: f"eval/{split}/")
  return {f"{prefix(s)}{k}": v for s, m in results.items() for k, v in m.items() if np.ndim(v) == 0}


def write_outputs(run: Run, steps: Steps, state, eval_sets, workdir: str,
                  keeper: best_lib.BestKeeper | None = None, evaluated: tuple | None = None) -> dict[str, Any]:
  """results.json, prediction files for every split and the exported model (`Task.export`: transformers format +
  tokenizer, or a sentence-transformers folder); of the best evaluation's parameters when `keep_best` kept some,
  else of the last step's. `evaluated`: (step, results, predictions) of the loop's evaluation of the labelled
  splits, reused when it is of the same parameters."""
  params, step = state.params, int(state.step)
  if keeper is not None and keeper.step is not None and keeper.step != step:
    params = keeper.load(run, steps.shardings.params)
  results, predictions = {}, {}
  if evaluated is not None and evaluated[0] == step and params is state.params:
    results, predictions = dict(evaluated[1]), dict(evaluated[2])
  rest = [eval_set for eval_set in eval_sets if eval_set.name not in predictions]
  more_results, more_predictions = evaluate(run, steps, params, rest, labelled_only=False)
  results, predictions = {**results, **more_results}, {**predictions, **more_predictions}
  params = evaluation.to_host(params)
  if jax.process_index() != 0:
    return results
  files = []
  for eval_set in eval_sets:
    files += run.task.write_outputs(eval_set, predictions[eval_set.name], workdir)
  export = write_export(run, params, workdir)
  summary = {"task": run.task.name, "step": int(state.step), "seed": run.config.seed,
             "init_from": run.config.init_from, "metrics": results, "files": sorted(files), "export": export,
             "config": run.config.to_dict()}
  if keeper is not None:
    summary["best"] = keeper.record()  # the step whose parameters the metrics, predictions and export are of
  # Written last: a results.json of the final step marks the outputs complete (`workdir_record.finished_message`).
  with atomic.open_for_write(os.path.join(workdir, "results.json"), encoding="utf-8") as f:
    json.dump(summary, f, indent=2, default=str)
  written = ["results.json", "export/ (the model)", *(os.path.relpath(f, workdir) for f in sorted(files))]
  log.info("results: %s; written in %s: %s", json.dumps(results), workdir, ", ".join(written))
  return results


# ----------------------------------------------------------------------------------------------------------
# A step that went non-finite stops the run before anything of it is kept.
# ----------------------------------------------------------------------------------------------------------


def check_finite(step: int, metrics, ckpt: ckpt_lib.Checkpointer) -> None:
  """Stops the run before the state of a non-finite step can be logged as good or reach a checkpoint."""
  if not int(metrics["nonfinite"]):
    return
  last = ckpt.latest_step()
  where = (f"The last good checkpoint is step {last}: rerun the same command with a lower learning rate (or fixed "
           "data) to resume from it." if last is not None else
           "No checkpoint was written before it: rerun with a lower learning rate (or fixed data) to start afresh.")
  raise TrainingError(f"non-finite training state at step {step} (loss {float(metrics['loss'])}, gradient norm "
                      f"{float(metrics['grad_norm'])}, or NaN/inf in the updated parameters); nothing of it was "
                      f"saved. {where}")


# ----------------------------------------------------------------------------------------------------------
# The loop.
# ----------------------------------------------------------------------------------------------------------


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *, command: str | None = None
                       ) -> dict[str, float]:
  """Trains until `config.total_steps` (or SIGTERM, Ctrl-C) and returns the last logged metrics. `command`, the
  command line that started the run, is what the message of a stopped run tells the user to rerun."""
  run = plan(config, workdir)
  config, task = run.config, run.task
  rerun = workdir_record.check(workdir, config)  # a changed config stops here, before any file or compile
  if rerun.step is None and run.inherited:  # history.jsonl: what phase 2 took from init_from's workdir
    rerun = dataclasses.replace(rerun, changes=rerun.changes + run.inherited)
  # Pretraining's finished runs stop in run.py, before planning; called directly it resumes and saves nothing.
  finished = workdir_record.finished_message(workdir, config, rerun) if task.exports else None
  if finished:
    if jax.process_index() == 0:
      print(finished, flush=True)
    return {}
  # The training stream (distillation's teacher pass) only past the finished check and where steps are left (a
  # finished run writing its outputs again needs none), before any file is written: its failure changes nothing.
  if rerun.step is None or rerun.step < config.total_steps:
    run.batches  # pylint: disable=pointless-statement
  steps = build_steps(config, task, run.bert_config, run.mesh, run.rules)
  peak = flops_lib.Peak()  # a single-device matmul on CPU: before the mesh; measured again as the run goes
  keeper = best_lib.BestKeeper.from_config(config, workdir)  # an earlier run's best, by the same metric
  # Files appear only now that the configuration holds; a workdir this call creates is removed again if the run
  # fails before its state exists (a damaged init_from, a full disk), so a failed start leaves nothing behind.
  created = "://" not in workdir and not os.path.exists(workdir) and jax.process_index() == 0
  lock = workdir_lock.acquire(workdir, jax.process_index())  # another live run on this workdir: refused here
  try:  # the checkpoints' storage is probed first (writable, object generations): a refusal writes nothing more
    ckpt = ckpt_lib.Checkpointer(f"{workdir}/checkpoints", max_to_keep=config.max_checkpoints_to_keep,
                                 async_save=config.async_checkpointing, num_data_shards=run.shards.num_shards)
  except BaseException:
    lock.release()
    if created:
      shutil.rmtree(workdir, ignore_errors=True)
    raise
  writer = metrics_lib.MetricWriter(workdir, enabled=jax.process_index() == 0)

  def abandon():
    ckpt.close()
    writer.close()
    lock.release()
    if created:
      shutil.rmtree(workdir, ignore_errors=True)

  with jax.set_mesh(run.mesh), nn.logical_axis_rules(run.rules), storage_failures.library_tracebacks_off():
    try:
      check_resumable(run, ckpt)
      if keeper is not None and jax.process_index() == 0:
        keeper.recover()
      if jax.process_index() == 0:  # The workdir alone can then be loaded, fine-tuned from and served.
        run.tokenizer.save(os.path.join(workdir, architecture.TOKENIZER_DIR))
        removed = ckpt.remove_interrupted()
        if removed:
          log.info("removed %s in %s: the unfinished saves of an interrupted run", ", ".join(removed), ckpt.directory)
        workdir_record.record(workdir, config, rerun)
      log.info("task %s; mesh %s; state: %s", task.name, dict(run.mesh.shape),
               sharding.sharding_report(steps.abstract, steps.shardings))
      state, data_states, source = initial_state(run, steps, ckpt)
    except BaseException:
      abandon()
      raise
    start = int(state.step)
    # From here SIGTERM and Ctrl-C stop the run: at the next step, or at once while it waits for a compile.
    stop = StopRequest()
    compile_pool = ahead_lib.pool(interrupted=stop.acts_alone)
    try:
      log.info("state: %s (step %d of %d)", source, start, config.total_steps)
      writer.truncate_after(start)
      training = start < config.total_steps
      batches = run.batches if training else None
      if data_states is not None and training:
        batches.set_states(data_states)
      eval_sets = task.eval_sets(run.shards)
      if steps.split:  # every program the run will meet compiles now, two at a time, first met first
        ahead = list(dict.fromkeys(batches.upcoming_shapes(config.total_steps - start) or ())) if training else []
        shapes = eval_shapes(task, eval_sets, eval_batch_size(config))
        steps = steps.compile_ahead(ahead, lambda shape: task.train_spec(*shape), compile_pool)
        steps = steps.compile_predict_ahead(shapes, compile_pool)
        log.info("compiling in the background: the gradient at %s, the update and %d evaluation shape%s",
                 ", ".join(f"{rows}x{length}" for rows, length in ahead), len(shapes), "s" * (len(shapes) != 1))
      record = model_record(run)
      saved = start  # the newest step a checkpoint holds (a fresh run's step 0 needs none: the config remakes it)

      def to_global(local):
        return jax.tree.map(lambda x: jax.make_array_from_process_local_data(steps.data_sharding, x), local)

      def save(step, state, *, final, data=None):
        nonlocal saved
        try:
          ckpt.save(step, state.as_dict(), data_states=batches.get_states() if data is None else data,
                    config=config.to_dict(), bert_config=record, final=final)
          saved = step
        except ckpt_lib.CheckpointError as e:
          if final or isinstance(e, ckpt_lib.StorageFailure):
            raise
          log.error("%s", e)  # The state is still in memory; training goes on and the next save retries.

      tokens = flops_lib.RealTokens(lambda shape: task.step_flops(run.bert_config, *shape))
      progress = metrics_lib.Progress(total_steps=config.total_steps, start_step=start)
      compiled = compile_cache.compiles()
      last_metrics: dict[str, float] = {}
      pending = None  # metrics of the step before, read while the current step runs
      evaluated = None  # the last evaluation: (step, results, predictions)
      done, before = start, None  # the last step done; the data states before a step that is still running
      evaluating = False
      try:
        for step in range(start, config.total_steps):
          # A step abandoned while its program compiles has taken its batch: the save rewinds to these states.
          before = batches.get_states() if steps.split else None
          local = next(batches)
          check_ids(local, run.bert_config.vocab_size,  # XLA would clamp them
                    run.bert_config.type_vocab_size if run.bert_config.reads_token_types else None)
          state, metrics = steps.train(state, to_global(local))
          before = None
          rows = local["input_ids"].shape[0] * jax.process_count()  # the global batch's: packed, not batch_size
          tokens.add(metrics.pop("real_tokens"), rows * int(np.prod(local["input_ids"].shape[1:])),
                     (rows, local["input_ids"].shape[-1]))
          failed = ckpt.poll()  # a background save that failed is reported now, under its own step
          if isinstance(failed, ckpt_lib.StorageFailure):
            raise failed
          if pending is not None:
            check_finite(*pending, ckpt)
          done, pending = step + 1, (step + 1, metrics)
          if step == start:  # Compilation (and restoring) stay out of the rate and the ETA.
            jax.block_until_ready(metrics)
            first_s = progress.start(done)
            compile_pool.waited()
            tokens.reset()
            if jax.process_index() == 0:
              log.info("step %d done in %.1f s (%s); training to step %d", done, first_s,
                       (compile_cache.compiles() - compiled).describe(), config.total_steps)
          log_now = _every(done, config.log_every_steps, config.total_steps)
          # Between logged steps the clock adds console lines, on process 0 alone: metrics.jsonl keeps its steps.
          console_now = not log_now and jax.process_index() == 0 and progress.due()
          eval_now = bool(eval_sets) and _every(done, config.eval_every_steps, config.total_steps)
          preempted = stop.agreed()
          save_now = _every(done, config.checkpoint_every_steps, config.total_steps) or preempted
          if log_now or eval_now or save_now:  # this step's state is about to be logged, evaluated or kept
            check_finite(*pending, ckpt)
            pending = None
          progress.exclude(compile_pool.waited())  # as are the waits for programs compiling in the background
          if log_now or console_now:
            scalars = {f"train/{k}": float(v) for k, v in jax.device_get(metrics).items() if k != "nonfinite"}
            rate = progress.update(done)
            scalars["train/steps_per_sec"] = rate
            per_step, padding, flops = tokens.window()
            scalars["train/tokens_per_sec"] = rate * per_step
            scalars["train/padding_fraction"] = padding
            peak_now, measuring_s = peak.refresh()
            progress.exclude(measuring_s)  # after `update`: out of the next line's rate
            scalars["train/mfu"] = flops_lib.mfu(flops, 1 / rate, peak_now * jax.device_count()) if rate else 0.0
            if log_now:
              with writable.outage_stops(ckpt, writer.path, done):
                writer.write(done, scalars)
              last_metrics = scalars
            if jax.process_index() == 0:
              log.info("%s", progress.line(done, scalars, mfu_label=peak.label))
          if eval_now:
            evaluating = True
            evaluated = (done, *evaluate(run, steps, state.params, eval_sets))
            evaluating = False
            scalars = eval_scalars(evaluated[1])
            with writable.outage_stops(ckpt, writer.path, done):
              writer.write(done, scalars)
            if jax.process_index() == 0:
              log.info("%s", metrics_lib.format_eval(done, scalars))
            if keeper is not None:
              with writable.outage_stops(ckpt, os.path.join(workdir, "best"), done):
                keeper.update(done, scalars, state.params, run)
          if save_now:
            save(done, state, final=preempted or done == config.total_steps)
          if preempted:
            log.warning("%s", stop.stopped_message(done, command))
            return last_metrics
        ckpt.wait()
        if task.exports and int(state.step) >= config.total_steps:
          with writable.outage_stops(ckpt, f"the outputs in {workdir}", done):
            write_outputs(run, steps, state, eval_sets, workdir, keeper, evaluated)
      except ahead_lib.Abandoned:
        # Stopped while waiting for a program still compiling: what was trained is kept, the compile is not
        # waited for (nor, at exit, any other: `ahead.leave`).
        if pending is not None:
          check_finite(*pending, ckpt)
        if saved != done:
          save(done, state, final=True, data=before)
        if evaluating and keeper is not None:
          log.warning("the evaluation of step %d was stopped before it ran: keep_best will not consider step %d.",
                      done, done)
        log.warning("%s", stop.stopped_message(done, command))
    finally:
      compile_pool.shutdown(wait=False, cancel_futures=True)  # programs a stopped run no longer needs, unjoined
      stop.restore()
      down = ckpt.storage_down  # then nothing more is written or waited for: each try would wait out retries
      ckpt.close()
      writer.close(upload=not down)
      lock.release(write=not down)
      if down:
        ahead_lib.abandon("the writes of a storage that stopped answering")
  return last_metrics
