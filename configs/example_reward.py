"""An example of your own reward function (``verifier.reward``), for configs/example.toml:

    rlx run configs/example.toml --set verifier.reward="configs/example_reward.py"

rlx calls ``reward(prompt, completion, answer)`` for every completion, in the code sandbox: one
file, the standard library only. ``prompt`` is the problem's prompt text, ``completion`` the
model's completion (up to its end token), ``answer`` the problem's reference answer (None when
it has none). It returns the completion's reward, a finite number; 1 or more counts as passed.
It must be a pure function of its arguments: a replay takes the recorded rewards as they are.
"""

import re


def reward(prompt, completion, answer):
    """1 for exactly the reference answer, 0.5 when it is the completion's last number, else 0."""
    text = completion.strip()
    if text == answer:
        return 1.0
    numbers = re.findall(r"-?\d+", text)
    return 0.5 if numbers and numbers[-1] == answer else 0.0
