"""The inference engine: continuous batching over a paged KV cache, batch-invariant sampling.

``Engine(model, max_slots=…, page_size=…, num_pages=…).generate(prompts, params, seeds)`` returns
one ``Completion`` per prompt; a completion is a pure function of (weights, prompt, sampling
params, seed, and the ids fed after the prompt). A request may go on turn after turn (``then``
returns a ``Continuation``), keeping its KV pages. ``SamplingParams`` says how a request is decoded; ``PagePool`` is the page
allocator; ``scheduler`` holds the batching decisions and ``sampling`` the sampler.
"""

from runtime.inference.engine import Engine
from runtime.inference.pages import NULL_PAGE, OutOfPages, PagePool
from runtime.inference.requests import Completion, Continuation, GenerateStats
from runtime.inference.sampling import FINISH_LENGTH, FINISH_STOP, SamplingParams

__all__ = [
    "FINISH_LENGTH",
    "FINISH_STOP",
    "NULL_PAGE",
    "Completion",
    "Continuation",
    "Engine",
    "GenerateStats",
    "OutOfPages",
    "PagePool",
    "SamplingParams",
]
