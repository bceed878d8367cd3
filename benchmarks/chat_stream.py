"""The chat app's decode speed against the engine's alone: what streaming a reply into the
Textual app costs on a machine whose cores the kernels also use.

Each round, the app (headless: laid out and rendered as on a terminal of --size, with the
inspector open if asked) answers --prompt in a new session, greedy, the repetition guard off;
then `LLM.generate` answers the same prompt (the chat's rendering of its system prompt and
the message), in the same process (one process per round). Each one's speed is its reply's
tokens over the time from the prompt's sending to the reply's end (the prompt's own time, a few
tens of milliseconds, included in both).

    python benchmarks/chat_stream.py --model qwen2.5-coder-0.5b --rounds 2
    python benchmarks/chat_stream.py --model qwen2.5-coder-0.5b --inspector

Prints each round's speeds and their ratio (the app's over the engine's alone).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

PROMPT = ("Explain in detail how virtual memory paging works in operating systems: page tables, "
          "TLBs, page faults, replacement policies. Write at least 600 words of prose, no code.")


async def app_rate(args: argparse.Namespace, folder: Path) -> tuple[int, float]:
    """The app's reply: its tokens and tokens/s."""
    from pagedchat.chat.conversation import SamplingSettings
    from pagedchat.chat.driver import load_engine
    from pagedchat.chat.store import Store
    from pagedchat.engine.presets import PRESETS
    from pagedchat.tui.app import ChatApp

    settings = SamplingSettings(temperature=0.0, max_tokens=args.max_tokens, loop_guard=False)
    loader = partial(load_engine, args.model, num_kv_blocks=PRESETS["chat"].num_kv_blocks,
                     max_num_seqs=PRESETS["chat"].max_num_seqs)
    app = ChatApp(Store(folder / "chats.db"), loader, args.model or "default", settings=settings)
    width, height = map(int, args.size.split("x"))
    async with app.run_test(size=(width, height)) as pilot:
        while not app.replies.engine_ready:
            await pilot.pause(0.05)
        if args.inspector:
            await pilot.press("f3")
        app.query_one("#input").insert(args.prompt)
        started = time.perf_counter()
        await pilot.press("enter")
        turn = next(iter(app.replies.turns.values()))
        while app.replies.turns:  # seldom: the harness's own wake-ups take the app's thread
            await pilot.pause(0.1)
        seconds = time.perf_counter() - started
        tokens = turn.reply.output_tokens
    return tokens, tokens / seconds


def engine_rate(args: argparse.Namespace) -> tuple[int, float]:
    """``LLM.generate``'s reply to the same prompt (the chat's own rendering of its system
    prompt and the message; plain text for a model without a chat template): its tokens and
    tokens/s. For a plain-text model, the chat's stop string is left out: the reply may run
    longer than the app's."""
    from pagedchat import LLM, SamplingParams
    from pagedchat.chat.conversation import DEFAULT_SYSTEM_PROMPT
    from pagedchat.chat.prompt import build_prompt
    from pagedchat.engine.presets import PRESETS

    llm = LLM(model=args.model, num_kv_blocks=PRESETS["chat"].num_kv_blocks)
    prompt = build_prompt(llm.tokenizer, DEFAULT_SYSTEM_PROMPT,
                          [{"role": "user", "content": args.prompt}])
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    started = time.perf_counter()
    [out] = llm.generate([prompt.token_ids], params, use_progress=False)
    tokens = len(out.outputs[0].token_ids)
    return tokens, tokens / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="as `pagedchat chat --model`")
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3, help="each in a process of its own")
    parser.add_argument("--size", default="140x40", help="the terminal, COLUMNSxROWS")
    parser.add_argument("--inspector", action="store_true", help="with the inspector open (F3)")
    parser.add_argument("--one-round", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one_round:
        with tempfile.TemporaryDirectory() as tmp:
            app = asyncio.run(app_rate(args, Path(tmp)))
        print(json.dumps({"app": app, "alone": engine_rate(args)}))
        return
    ratios = []
    for round_ in range(1, args.rounds + 1):
        # a process per round: a second app or engine in one process ran slower than the first
        done = subprocess.run([sys.executable, __file__, *(argv or sys.argv[1:]), "--one-round"],
                              capture_output=True, text=True, check=True)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        (app_tokens, app), (alone_tokens, alone) = result["app"], result["alone"]
        ratios.append(app / alone)
        print(f"round {round_}: app {app:.1f} tokens/s ({app_tokens} tokens), engine alone "
              f"{alone:.1f} tokens/s ({alone_tokens} tokens): {app / alone:.2f}x", flush=True)
    print(f"median ratio, the app's over the engine's alone: {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
