"""What a run needs of its machines: the mesh and logical-axis rules (`sharding`), FLOPs and peak FLOP/s
(`flops`), metric files and console lines (`metrics`), library start-up noise kept off the console
(`console`), `gs://` storage for every client (`storage`) and copies between a bucket and the local disk
(`mirror`)."""
