"""A workdir's durable state: Orbax checkpoints (`manager`), the data-iterator state inside them (`data_state`),
array fingerprints that name a damaged file (`integrity`) and the one-run-per-workdir lock (`lock`)."""
