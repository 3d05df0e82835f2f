"""What a run needs of its machines: the mesh and logical-axis rules (`sharding`), FLOPs and peak FLOP/s
(`flops`), metric files and console lines (`metrics`), and library start-up noise kept off the console
(`console`)."""
