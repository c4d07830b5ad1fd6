"""The packaged GPU worker (`python -m worker run ...`): standalone, never imports Django, talks
to the control plane over HTTP only. The training code arrives with the worker issue."""
