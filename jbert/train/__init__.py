"""Training: the run's model and tokenizer (`architecture`), optimiser (`optim`), jitted steps (`step`), the
evaluation predict path (`evaluation`) and the loop that ties them (`trainer.train_and_evaluate`)."""
