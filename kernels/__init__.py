"""Pure JAX compute: attention, log-probs, advantages, KL estimators and the unified RL objective."""
