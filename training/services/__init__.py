"""Every state change of training: datasets, submit and the state machine, the worker's reports,
log archiving. One module per seam."""
