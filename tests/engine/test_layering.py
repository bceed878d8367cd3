"""The engine's floors: each module imports only from its own floor or the floors below, so
data flows one way (pagedchat/engine/API.md, "Layout"). Read from the source (ast), every
import counted, type-only ones too; a new module must be given a floor here."""

from __future__ import annotations

import fnmatch

from tests.import_graph import import_graph

# lowest first; names relative to pagedchat.engine ("" is the package itself)
FLOORS: list[tuple[str, list[str]]] = [
    ("ground", ["", "errors", "model_config", "kv_groups", "fits", "config", "presets",
                "sampling_params", "sequence", "outputs", "step_input"]),
    ("loading", ["loading", "loading.*"]),
    ("model", ["parallel", "parallel.tensor_parallel", "layers", "layers.*", "models",
               "models.*"]),
    ("runner", ["runner", "runner.*", "parallel.parallel_runner", "parallel.worker"]),
    ("scheduling", ["blocks", "prefix_cache", "block_manager", "step_costs", "ngram_proposer",
                    "scheduler", "stats"]),
    ("sampling", ["sampling", "sampling.*"]),
    ("engine", ["opening", "speculation", "request_outputs", "kv_store", "llm_engine",
                "engine_thread"]),
    ("llm", ["llm"]),
]
ENGINE = "pagedchat.engine"
# what the engine may import of the rest of the package: no UI, server or bench code
OUTSIDE = ("pagedchat.kernels", "pagedchat.machine", "pagedchat.paths", "pagedchat.progress")


def floor_of(module: str) -> int:
    relative = module.removeprefix(ENGINE).removeprefix(".")
    found = [level for level, (_, patterns) in enumerate(FLOORS)
             if any(fnmatch.fnmatchcase(relative, pattern) for pattern in patterns)]
    assert len(found) == 1, f"{module} must be on exactly one floor of FLOORS, is on {found}"
    return found[0]


def engine_graph():
    return {name: imports for name, imports in import_graph().items()
            if name == ENGINE or name.startswith(ENGINE + ".")}


def test_every_engine_module_has_one_floor():
    for module in engine_graph():
        floor_of(module)


def test_no_import_runs_back_up():
    upward = []
    for module, imports in engine_graph().items():
        for found in imports:
            if found.target.startswith(ENGINE) and floor_of(found.target) > floor_of(module):
                upward.append(f"{module}:{found.line} imports {found.target} "
                              f"({FLOORS[floor_of(module)][0]} -> "
                              f"{FLOORS[floor_of(found.target)][0]})")
    assert upward == []


def test_the_engine_reaches_only_the_kernels():
    outside = [f"{module}:{found.line} imports {found.target}"
               for module, imports in engine_graph().items() for found in imports
               if not found.target.startswith(ENGINE)
               and not found.target.startswith(OUTSIDE)]
    assert outside == []


def test_the_kernels_import_nothing_of_the_engine():
    graph = import_graph()
    into_engine = [f"{module}:{found.line} imports {found.target}"
                   for module, imports in graph.items() if module.startswith("pagedchat.kernels")
                   for found in imports if found.target.startswith(ENGINE)]
    assert into_engine == []
