"""A tiny decoder and one warmed-up engine shared by the engine tests."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from runtime.inference import Engine
from runtime.model import Model, ModelConfig

EOS = 2
CONFIG = ModelConfig(
    vocab_size=53, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
    intermediate_size=64, qkv_bias=True, rope_theta=1000.0, max_position_embeddings=64,
    eos_token_id=EOS,
)
# 4 slots; 20 usable pages of 4 tokens hold 80 tokens, while 4 sequences of up to 32 tokens
# (max_seq_len) can need 128: a full batch of long requests runs out of pages and preempts.
# Prefill runs 4 prompts of bucket 16 per call, 2 of bucket 32.
ENGINE = dict(max_slots=4, page_size=4, num_pages=21, max_seq_len=32)


def widened_model(seed: int = 0, config: ModelConfig = CONFIG) -> Model:
    """Random weights spread wider than the init, so that logits are far from ties."""
    model = Model.init(config, key=jax.random.key(seed))
    keys = iter(jax.random.split(jax.random.key(seed + 1), 64))

    def widen(path, x):
        noise = jax.random.normal(next(keys), x.shape, jnp.float32)
        return (1.0 + 0.2 * noise if path[-1].key == "scale" else 0.3 * noise).astype(x.dtype)

    return model.with_params(jax.tree_util.tree_map_with_path(widen, model.params))


@pytest.fixture(scope="session")
def model() -> Model:
    return widened_model()


@pytest.fixture(scope="session")
def engine(model) -> Engine:
    return Engine(model, **ENGINE)
