"""Reward 1 when the answer is this episode's code word (what `./lookup code` prints for the
seed the reset wrote), else 0. Exact match after trimming: a list of words is not an answer."""
import hashlib
import json
import os

CODE_WORDS = ("amber", "birch", "cedar", "delta", "ember", "fjord", "grove", "harbor", "iris", "jade", "kelp", "lotus",
              "maple", "nectar", "onyx", "pearl", "quartz", "raven", "sable", "tulip")
seed = os.environ["ENVKIT_SEED"]
expected = CODE_WORDS[int(hashlib.sha256(f"{seed}:code".encode()).hexdigest()[:15], 16) % len(CODE_WORDS)]  # as ./lookup
answer = os.environ.get("ENVKIT_ANSWER")
reward = 1.0 if answer is not None and answer.strip() == expected else 0.0
print(json.dumps({"reward": reward, "answered": answer is not None}))
