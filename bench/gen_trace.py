#!/usr/bin/env python3
"""Write a synthetic Mooncake-format trace (one JSON request a line:
timestamp ms, input_length, output_length, hash_ids of 512-token blocks).

The model: requests arrive as a Poisson stream; each starts a new session
(with probability 1 - p_follow) or continues one of the open sessions
(a conversation turn: the previous request's blocks plus the new turn).
A new session begins with one of --prompts shared system prompts, chosen by
a Zipf law of exponent --skew (0: uniform). Block ids are prefix-aware:
the same id means the same prefix, as in Mooncake's traces.

  bench/gen_trace.py OUT --seed 1 [--requests 4000] [--skew 1.0]
      [--turns 4] [--prompt-blocks 8] [--turn-blocks 6] [--prompts 200]
"""
import argparse
import json
import random


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--skew", type=float, default=1.0, help="Zipf exponent of system prompts")
    ap.add_argument("--turns", type=float, default=4, help="mean turns per session")
    ap.add_argument("--prompt-blocks", type=int, default=8, help="mean system prompt blocks")
    ap.add_argument("--turn-blocks", type=int, default=6, help="mean new blocks a turn")
    ap.add_argument("--prompts", type=int, default=200, help="distinct system prompts")
    ap.add_argument("--open", type=int, default=64, help="sessions open at once")
    ap.add_argument("--rate", type=float, default=4.0, help="requests per second")
    a = ap.parse_args()
    rnd = random.Random(a.seed)
    nid = 0

    def fresh(n):
        nonlocal nid
        ids = list(range(nid, nid + n))
        nid += n
        return ids

    prompts = [fresh(max(1, int(rnd.expovariate(1 / a.prompt_blocks)) + 1)) for _ in range(a.prompts)]
    weights = [1 / (i + 1) ** a.skew for i in range(a.prompts)]
    sessions = []  # [blocks so far, turns left]
    t = 0.0
    with open(a.out, "w") as f:
        for _ in range(a.requests):
            t += rnd.expovariate(a.rate)
            p_follow = len(sessions) / a.open
            if sessions and rnd.random() < p_follow:
                i = rnd.randrange(len(sessions))
                s = sessions[i]
                s[0] = s[0] + fresh(max(1, int(rnd.expovariate(1 / a.turn_blocks)) + 1))
                s[1] -= 1
                blocks = s[0]
                if s[1] <= 0 or len(blocks) > 400:
                    sessions.pop(i)
            else:
                p = rnd.choices(prompts, weights)[0]
                blocks = p + fresh(max(1, int(rnd.expovariate(1 / a.turn_blocks)) + 1))
                turns = max(1, round(rnd.expovariate(1 / a.turns)))
                if turns > 1:
                    sessions.append([blocks, turns - 1])
            f.write(json.dumps({"timestamp": int(t * 1000), "input_length": 512 * len(blocks),
                                "output_length": rnd.randint(1, 64), "hash_ids": blocks}) + "\n")


if __name__ == "__main__":
    main()
