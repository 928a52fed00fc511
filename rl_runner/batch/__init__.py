"""Batch assembly: which episodes run when, when a batch closes, what happens to stragglers,
and the figures that say how long the trainer waited (time to a trainable batch)."""
