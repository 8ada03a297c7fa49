"""Every head of every family, image and sequence, compiles as one graph and exports, matching eager mode.

Value checks on the inputs (vocabulary range, iMixer's count of real tokens) read tensors into Python; they run
in eager mode only, so under `torch.compile(fullgraph=True)` (which raises on any graph break) and `torch.export`
there is none. The
default tests use dynamo's capture with the `aot_eager` backend (the graph, AOT autograd and decompositions,
without code generation, which takes minutes on 2 cores); `-m slow` also runs the inductor backend.
"""

from __future__ import annotations

import pytest
import torch
from fixtures import ALL, HEADS, Case, cases, main_output, perturb


def build(case: Case, train: bool = False) -> torch.nn.Module:
    model = perturb(case.build())  # zero-initialised heads and step sizes would hide wrong numbers
    return model.train(train)


@cases(ALL)
def test_compile_fullgraph_matches_eager(case):
    torch._dynamo.reset()
    model, inputs = build(case), case.inputs()
    expected = main_output(model(**inputs))
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(main_output(compiled(**inputs)), expected)
    other = case.inputs(seed=1)  # new values, same shapes: no recompilation needed, same answer as eager
    torch.testing.assert_close(main_output(compiled(**other)), main_output(model(**other)))


@cases(HEADS)
def test_compiled_training_step_matches_eager_gradients(case):
    torch._dynamo.reset()
    inputs = case.inputs(labels=True)
    eager, compiled = build(case, train=True), build(case, train=True)
    eager(**inputs).loss.backward()
    torch.compile(compiled, fullgraph=True, backend="aot_eager")(**inputs).loss.backward()
    for (name, a), b in zip(eager.named_parameters(), compiled.parameters()):
        if a.grad is not None:
            torch.testing.assert_close(b.grad, a.grad, msg=name)


@cases(ALL)
def test_torch_export_matches_eager(case):
    model, inputs = build(case), case.inputs()
    program = torch.export.export(model, (), inputs)
    for seed in (0, 1):
        inputs = case.inputs(seed=seed)
        torch.testing.assert_close(main_output(program.module()(**inputs)), main_output(model(**inputs)))


@pytest.mark.slow
@cases(ALL)
def test_inductor_compile_matches_eager(case):
    torch._dynamo.reset()
    model, inputs = build(case), case.inputs()
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(
        main_output(compiled(**inputs)), main_output(model(**inputs)), atol=1e-4, rtol=1e-4
    )
