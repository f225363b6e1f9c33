"""Pure JAX compute: attention, log-probs, advantages, KL estimators and the unified RL objective.

Modules: ``paged_attention`` / ``attention`` / ``kv_pages`` (attention over a paged KV cache),
``logprobs`` (the one log-prob definition shared by sampler and trainer), ``advantages``, ``kl``,
``aggregation``, ``objectives`` (``policy_loss``, ``preference_loss``), ``algorithms`` (the
registry). Import from the modules; nothing here pulls in JAX until a module is used.
"""
