"""Built-in ablation plugins, one room per optimization (imported as `microscope_kernels`)."""
