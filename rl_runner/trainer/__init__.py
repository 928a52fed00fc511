"""The torch trainer: GRPO-style group advantages, importance correction against the
behaviour log-probs (truncated or masked), AdamW, checkpoints with exact resume."""
