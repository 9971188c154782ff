"""Learning on top of a frozen backbone: SimCLR pretraining, batched teacher heads, the student."""
