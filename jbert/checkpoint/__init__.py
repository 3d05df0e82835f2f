"""A workdir's durable state: Orbax checkpoints (`manager`, its restoring half `restoring`; `reading` for loaders
that only read them; `writable`: their errors and the storage probed before a run), the data-iterator state inside
them (`data_state`), array fingerprints that name a damaged file (`integrity`) and the one-run-per-workdir lock
(`lock`)."""
