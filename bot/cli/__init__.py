"""The `gpubot` command line: `app` puts the commands together, one module per subject."""
