"""prepare's worker processes: results in this process, a job's exception raised here with its type, a worker
that dies named by its job in one line. (Ctrl-C and SIGTERM: tests/data/test_prepare.py, through the command.)"""
import math
import os

import pytest

from jbert import errors
from jbert.data import workers


def test_every_job_runs_once_and_its_result_comes_back():
  results = []
  workers.run(math.sqrt, [4.0, 9.0, 16.0, 25.0, 36.0], 2, results.append)
  assert sorted(results) == [2.0, 3.0, 4.0, 5.0, 6.0]


def test_a_job_s_exception_is_raised_here():
  with pytest.raises(ValueError, match="math domain error"):
    workers.run(math.sqrt, [4.0, -1.0], 2, lambda result: None)


def test_a_worker_that_dies_fails_the_run_naming_its_job():
  with pytest.raises(errors.UserError) as error:
    # pylint: disable-next=protected-access
    workers.run(os._exit, [9], 1, lambda result: None, name=lambda job: f"job {job}")
  assert str(error.value) == ("the worker process for job 9 died (exit status 9; -9 is often the system out of "
                              "memory); rerun with fewer --workers: the finished work is kept.")
