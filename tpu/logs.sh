#!/usr/bin/env bash
# Follows the training log of one host (WORKER, default 0: process 0 logs the steps and evaluations).
#
#   TPU_NAME=jbert ZONE=us-central2-b tpu/logs.sh          # Ctrl-C stops following; the run goes on
#   LINES=200 WORKER=3 tpu/logs.sh
source "$(dirname "$0")/common.sh"
on_worker "tail -n ${LINES:-50} -F $LOG_FILE"
