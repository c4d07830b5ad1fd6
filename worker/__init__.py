"""The packaged GPU worker (`python -m worker run ...`): standalone, never imports Django,
talks to the control plane over HTTP only. `python -m worker.tinymodel DIR` makes a tiny model."""
