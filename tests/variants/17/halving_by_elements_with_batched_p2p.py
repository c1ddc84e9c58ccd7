"""Part A written another way, appended after the reference so it replaces it: hd_all_reduce halves element
ranges (not block indices) from the farthest partner first (distance p/2, as in Rabenseifner's paper), moves
data with batch_isend_irecv and group_peer (group ranks, never global ones) and folds with isend/irecv; the trees
recurse over relative ranks and receive the children largest-first, with group_src/group_dst. Proves: any
balanced halving order meets the element bound (nested halves of N differ by at most one element), and the
graders read messages, not which torch.distributed entry point sent them."""
MAY_FAIL = []
SELECT = "(hd_all_reduce and (W3 or W4 or W6 or errors or views)) or tree_broadcast_values or (tree_reduce and not W8)"
MUTATE = [('''    return {"names": names, "results": results, "error": error, "trace": rec.trace(), "dump": dump,
            "restored": restored}
''', '''    return {"names": names, "results": results, "error": error, "trace": rec.trace(), "dump": dump,
            "restored": restored}


# --- the variant: Part A again ---------------------------------------------------------------------

def _swap(group, peer, out, inp):
    ops = [dist.P2POp(dist.isend, out, group=group, group_peer=peer),
           dist.P2POp(dist.irecv, inp, group=group, group_peer=peer)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()


def hd_all_reduce(tensor, op="sum", group=None):  # noqa: F811 - replaces the reference's
    _check(tensor, op)
    me, W = dist.get_rank(group), dist.get_world_size(group)
    N = tensor.numel()
    work = tensor.reshape(-1).to(_acc_dtype(tensor.dtype), copy=True)
    if W > 1 and N > 0:
        p = 2 ** (W.bit_length() - 1)
        extra = W - p
        folded = me < 2 * extra
        if folded and me % 2 == 0:
            dist.isend(work, group=group, group_dst=me + 1).wait()
            dist.irecv(work, group=group, group_src=me + 1).wait()
        else:
            if folded:
                other = torch.empty_like(work)
                dist.irecv(other, group=group, group_src=me - 1).wait()
                _combine(work, other, op)
            v = me // 2 if folded else me - extra
            to_group = lambda u: 2 * u + 1 if u < extra else u + extra
            lo, hi, history = 0, N, []
            d = p // 2
            while d >= 1:                      # farthest partner first
                u = v ^ d
                mid = lo + (hi - lo) // 2
                mine, theirs = ((lo, mid), (mid, hi)) if v < u else ((mid, hi), (lo, mid))
                got = torch.empty(mine[1] - mine[0], dtype=work.dtype)
                _swap(group, to_group(u), work[theirs[0]:theirs[1]].clone(), got)
                _combine(work[mine[0]:mine[1]], got, op)
                history.append((u, mine, theirs))
                lo, hi = mine
                d //= 2
            for u, mine, theirs in reversed(history):
                got = torch.empty(theirs[1] - theirs[0], dtype=work.dtype)
                _swap(group, to_group(u), work[mine[0]:mine[1]].clone(), got)
                work[theirs[0]:theirs[1]] = got
            if folded:
                dist.isend(work, group=group, group_dst=me - 1).wait()
    return _finish(tensor, work, op, W if W > 1 and N > 0 else 1)


def _children(v, W):
    """Relative ranks of v's children in the binomial tree, largest subtree first."""
    top = (v & -v) if v else 1 << max(W - 1, 0).bit_length()
    return [v + m for m in (1 << k for k in reversed(range(top.bit_length() - 1))) if v + m < W]


def tree_broadcast(tensor, src=0, group=None):  # noqa: F811
    if not isinstance(tensor, torch.Tensor) or tensor.dtype not in DTYPES:
        raise TypeError(f"unsupported tensor or dtype: {getattr(tensor, 'dtype', type(tensor).__name__)}")
    me, W = dist.get_rank(group), dist.get_world_size(group)
    _check_root(src, W, "src")
    if W == 1 or tensor.numel() == 0:
        return tensor
    v = (me - src) % W
    data = tensor.reshape(-1).clone()
    if v:
        dist.irecv(data, group=group, group_src=(v - (v & -v) + src) % W).wait()
        tensor.copy_(data.view(tensor.shape))
    for c in _children(v, W):
        dist.isend(data, group=group, group_dst=(c + src) % W).wait()
    return tensor


def tree_reduce(tensor, dst=0, op="sum", group=None):  # noqa: F811
    _check(tensor, op)
    me, W = dist.get_rank(group), dist.get_world_size(group)
    _check_root(dst, W, "dst")
    if tensor.numel() == 0:
        return tensor
    v = (me - dst) % W
    acc = tensor.reshape(-1).to(_acc_dtype(tensor.dtype), copy=True)
    for c in _children(v, W):
        part = torch.empty_like(acc)
        dist.irecv(part, group=group, group_src=(c + dst) % W).wait()
        _combine(acc, part, op)
    if v:
        dist.isend(acc, group=group, group_dst=(v - (v & -v) + dst) % W).wait()
        return tensor
    return _finish(tensor, acc, op, W)
''')]
