"""Lab 13 (compression and local steps): the mistakes of 13.1 to 13.3: error feedback kept wrong, the division by the
world size missing or misplaced, PowerSGD without its orthogonalisation, local SGD averaging gradients."""
from helpers.grading.prepare.labgen import ROOT
from tests.mistakes import Mistake

SOLUTION = ROOT / "solutions" / "13_compression_and_local_steps.ipynb"


def _hook(residual_in="buffer += state.residuals[i]", cast="buffer.to(state.dtype).div_(world)",
          residual_out="state.residuals[i] = buffer - compressed.to(buffer.dtype) * world",
          start="state.error_feedback and state.iter >= 1", copy="buffer.copy_(fut.value()[0])",
          returned="dist.all_reduce(compressed, async_op=True).get_future().then(decompress)"):
    """Lab 13.1's answer with one piece changed."""
    return f'''
def compress_hook(state, bucket):
    buffer, world, i = bucket.buffer(), dist.get_world_size(), bucket.index()
    feedback = {start}
    if feedback and i in state.residuals:
        {residual_in}
    compressed = {cast}
    if feedback:
        {residual_out}
    state.iter += bucket.is_last()

    def decompress(fut):
        {copy}
        return buffer

    return {returned}
'''


def _powersgd(start="state.iter < state.start_iter", error_in="buffer += state.errors[i]",
              qs="state.qs[i] if i in state.qs else random_qs(state, matrices)", orthogonalize_p="orthogonalize(p)",
              q_world="world"):
    """Lab 13.2's answer with one piece changed."""
    return f'''
def powersgd_hook(state, bucket):
    if {start}:
        state.iter += bucket.is_last()
        return allreduce_mean_hook(None, bucket)
    buffer, world, i = bucket.buffer(), dist.get_world_size(), bucket.index()
    if i in state.errors:
        {error_in}
    before = buffer.clone()
    matrices, others = split_for_compression(bucket, state)
    all_reduce_views(others, world)
    qs = {qs}
    for q in qs:
        orthogonalize(q)
    ps = [m @ q for m, q in zip(matrices, qs)]

    def compute_qs(fut):
        copy_flat(fut.value(), ps)
        for p in ps:
            {orthogonalize_p}
        state.qs[i] = [m.T @ p for m, p in zip(matrices, ps)]
        return all_reduce_flat(state.qs[i]).wait()

    def decompress(fut):
        copy_flat(fut.value(), state.qs[i], {q_world})
        for m, p, q in zip(matrices, ps, state.qs[i]):
            m.copy_(p @ q.T)
        state.errors[i] = before - buffer
        return buffer

    return all_reduce_flat(ps).then(compute_qs).then(decompress)
'''


_LOCAL_HELPERS = '''
def _average_params(model, divisor):
    params = parameters_to_vector(model.parameters())
    dist.all_reduce(params)
    vector_to_parameters(params / divisor, model.parameters())


def _average_grads(model):
    grads = parameters_to_vector([p.grad for p in model.parameters()])
    dist.all_reduce(grads)
    vector_to_parameters(grads / dist.get_world_size(), [p.grad for p in model.parameters()])
'''


def _local(when="(step + 1) % period == 0", before_step="pass",
           average="_average_params(model, dist.get_world_size())"):
    """Lab 13.3's answer with one piece changed."""
    return _LOCAL_HELPERS + f'''

def local_sgd(model, optimizer, batches, period):
    snapshots = []
    for step, (x, y) in enumerate(batches):
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        {before_step}
        optimizer.step()
        if {when}:
            with torch.no_grad():
                {average}
            snapshots.append(parameters_to_vector(model.parameters()).detach().cpu().clone())
    return snapshots
'''


MISTAKES = [
    # 13.1
    Mistake("13.1", "no division by the world size", _hook(cast="buffer.to(state.dtype)",
                                                           residual_out="state.residuals[i] = buffer - "
                                                                        "compressed.to(buffer.dtype)"),
            ("the SUM over ranks", "divide the 16-bit copy by the world size (3)")),
    Mistake("13.1", "divided by 2, not by the world size", _hook(cast="buffer.to(state.dtype).div_(2)",
                                                                 residual_out="state.residuals[i] = buffer - "
                                                                              "compressed.to(buffer.dtype) * 2"),
            ("divided by 2, not by the world size (3)",)),
    Mistake("13.1", "divided after the all-reduce", _hook(cast="buffer.to(state.dtype)",
                                                          copy="buffer.copy_(fut.value()[0].div_(world))"),
            ("rounded differently", "divide the 16-bit copy by the world size, before the all-reduce")),
    Mistake("13.1", "the float32 buffer on the wire", _hook(
        returned="dist.all_reduce(buffer.div_(world), async_op=True).get_future().then(lambda fut: buffer)"),
            ("went over the wire as float32", "all-reduce buffer.to(state.dtype)")),
    Mistake("13.1", "returns the tensor, not a future", _hook(
        returned="(dist.all_reduce(compressed), buffer.copy_(compressed))[1]"),
            ("DDP refused what the hook returned", "return the Future")),
    Mistake("13.1", "error feedback not updated", _hook(
        residual_out="state.residuals.setdefault(i, buffer - compressed.to(buffer.dtype) * world)"),
            ("stored once and never updated",)),
    Mistake("13.1", "residual added twice", _hook(
        residual_out="state.residuals[i] = state.residuals.get(i, 0) + buffer - compressed.to(buffer.dtype) * world"),
            ("counted twice", "assign it")),
    Mistake("13.1", "residual kept but never added", _hook(residual_in="pass"),
            ("was not added to the buffer before the cast",)),
    Mistake("13.1", "residual without the world size", _hook(
        residual_out="state.residuals[i] = buffer - compressed.to(buffer.dtype)"),
            ("multiply it back", "buffer - world x the 16-bit copy")),
    Mistake("13.1", "error feedback from the first backward", _hook(start="state.error_feedback"),
            ("added to a rebuilt bucket", "state.iter >= 1")),
    # 13.2
    Mistake("13.2", "PowerSGD without orthogonalisation", _powersgd(orthogonalize_p="pass"),
            ("P was not orthogonalised", "orthogonalize(p)")),
    Mistake("13.2", "the Qs summed, not averaged", _powersgd(q_world="None"),
            ("the SUM of the Qs over ranks", "divide the all-reduced Qs by the world size (3)")),
    Mistake("13.2", "no error feedback", _powersgd(error_in="pass"),
            ("error feedback is missing",)),
    Mistake("13.2", "no warm start", _powersgd(qs="random_qs(state, matrices)"),
            ("new random Qs at every step", "warm start")),
    Mistake("13.2", "compressed from the first backward", _powersgd(start="False"),
            ("compressed from the first backward", "plain all-reduces")),
    # 13.3
    Mistake("13.3", "gradients averaged instead of parameters",
            _local(before_step="if (step + 1) % period == 0: _average_grads(model)", average="pass"),
            ("the GRADIENTS were averaged", "all-reduce the parameters")),
    Mistake("13.3", "the sum of the parameters", _local(average="_average_params(model, 1)"),
            ("the SUM of the parameters over ranks", "divide by the world size (3)")),
    Mistake("13.3", "divided by 2, not by the world size", _local(average="_average_params(model, 2)"),
            ("divided by 2, not by the world size (3)",)),
    Mistake("13.3", "averaged one step early", _local(when="step % period == 0"),
            ("after steps 1, 5, 9", "(step + 1) % period == 0")),
    Mistake("13.3", "averaged after every step", _local(when="True"),
            ("averaged after every step", "every `period` (4) steps")),
]
