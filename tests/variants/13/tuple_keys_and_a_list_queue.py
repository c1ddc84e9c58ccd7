"""Parts A-C written another way, appended after the reference so they replace it: the BlockManager keys its
prefix cache by the exact token prefix (a tuple of every token up to the block's end: no hashing, no chain), keeps
the free queue in a plain list (``pop(0)``, ``remove``, ``append``) and per-block state in lists; the Scheduler
walks ``running`` with an index and a helper per phase; ``build_model_inputs`` is vectorized with torch
(``repeat_interleave``, ``gather``); the engine builds its inputs inline (not through ``build_model_inputs``) and
calls ``model.forward``; ``generate`` keeps outputs in a dict. Proves: any key that matches exactly the same
prefixes is fine, and the graders read behaviour, not the reference's data structures."""
MAY_FAIL = []
MUTATE = [("        return [list(self.sequences[i].output) for i in ids]\n",
           "        return [list(self.sequences[i].output) for i in ids]\n" '''

# --- the variant: every task again, written another way -------------------------------------------

class BlockManager:  # noqa: F811 - replaces the reference's
    def __init__(self, num_blocks, block_size):
        for name, v in (("num_blocks", num_blocks), ("block_size", block_size)):
            if type(v) is not int or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.counts = [0] * num_blocks
        self.queue = list(range(num_blocks))
        self.prefix_of = [None] * num_blocks      # the cached prefix (a tuple) a block holds, or None
        self.block_of = {}                        # prefix tuple -> block
        self.seqs = {}                            # seq_id -> [table, slots, offered]

    @property
    def num_free_blocks(self):
        return len(self.queue)

    def _seq(self, seq_id):
        try:
            return self.seqs[seq_id]
        except KeyError:
            raise ValueError(f"seq_id {seq_id!r} is unknown") from None

    def _hit_blocks(self, token_ids):
        B, out = self.block_size, []
        for end in range(B, (len(token_ids) - 1) // B * B + 1, B):
            b = self.block_of.get(tuple(token_ids[:end]))
            if b is None:
                break
            out.append(b)
        return out

    def cached_prefix_len(self, token_ids):
        return self.block_size * len(self._hit_blocks(token_ids))

    def can_allocate(self, token_ids):
        hits = self._hit_blocks(token_ids)
        need = -(-len(token_ids) // self.block_size) - len([b for b in hits if self.counts[b]])
        return need <= len(self.queue)

    def _fresh(self):
        b = self.queue.pop(0)
        if self.prefix_of[b] is not None:
            del self.block_of[self.prefix_of[b]]
            self.prefix_of[b] = None
        self.counts[b] = 1
        return b

    def allocate(self, seq_id, token_ids):
        if seq_id in self.seqs:
            raise ValueError(f"seq_id {seq_id!r} is live")
        if not token_ids:
            raise ValueError("empty token_ids")
        if not self.can_allocate(token_ids):
            raise NoFreeBlocksError(f"num_blocks={self.num_blocks}: not enough free blocks")
        table = self._hit_blocks(token_ids)
        for b in table:
            if self.counts[b] == 0:
                self.queue.remove(b)
            self.counts[b] += 1
        hits = len(table)
        while len(table) * self.block_size < len(token_ids):
            table.append(self._fresh())
        self.seqs[seq_id] = [table, len(token_ids), hits]
        return hits * self.block_size

    def can_append(self, seq_id):
        table, slots, _ = self._seq(seq_id)
        return slots < len(table) * self.block_size or len(self.queue) > 0

    def append_slot(self, seq_id):
        st = self._seq(seq_id)
        p = st[1]
        if p == len(st[0]) * self.block_size:
            if not self.queue:
                raise NoFreeBlocksError(f"no free block (num_blocks={self.num_blocks})")
            st[0].append(self._fresh())
        st[1] = p + 1
        return st[0][p // self.block_size] * self.block_size + p % self.block_size

    def cache_full_blocks(self, seq_id, token_ids):
        st = self._seq(seq_id)
        if len(token_ids) > st[1]:
            raise ValueError(f"{len(token_ids)} tokens > num_slots {st[1]}")
        while st[2] < len(token_ids) // self.block_size:
            i = st[2]
            key = tuple(token_ids[:(i + 1) * self.block_size])
            if key not in self.block_of:
                self.block_of[key] = st[0][i]
                self.prefix_of[st[0][i]] = key
            st[2] += 1

    def free(self, seq_id):
        table = self._seq(seq_id)[0]
        for b in table[::-1]:
            self.counts[b] -= 1
            if not self.counts[b]:
                self.queue.append(b)
        del self.seqs[seq_id]

    def free_block_ids(self):
        return self.queue[:]

    def _check(self, b):
        if type(b) is not int or not 0 <= b < self.num_blocks:
            raise ValueError(f"block id {b!r} is not in [0, {self.num_blocks})")
        return b

    def ref_count(self, block_id):
        return self.counts[self._check(block_id)]

    def is_cached(self, block_id):
        return self.prefix_of[self._check(block_id)] is not None

    def block_table(self, seq_id):
        return self._seq(seq_id)[0][:]

    def num_slots(self, seq_id):
        return self._seq(seq_id)[1]


class Scheduler:  # noqa: F811
    def __init__(self, block_manager, max_num_seqs, max_num_batched_tokens):
        if type(max_num_seqs) is not int or max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={max_num_seqs!r} < 1")
        if type(max_num_batched_tokens) is not int or max_num_batched_tokens < max_num_seqs:
            raise ValueError(f"max_num_batched_tokens={max_num_batched_tokens!r} < max_num_seqs")
        self.block_manager, self.max_num_seqs = block_manager, max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting, self.running = deque(), []

    def add(self, seq):
        need = len(seq.prompt) + seq.max_new_tokens - 1
        if need > self.max_num_batched_tokens:
            raise ValueError(f"needs {need} tokens at once > max_num_batched_tokens")
        if (need + self.block_manager.block_size - 1) // self.block_manager.block_size > self.block_manager.num_blocks:
            raise ValueError("needs more blocks than num_blocks")
        seq.status = "waiting"
        self.waiting.append(seq)

    def _decode(self, batch):
        bm, k = self.block_manager, 0
        preempted = False
        while k < len(self.running):
            seq = self.running[k]
            while not bm.can_append(seq.seq_id):
                victim = self.running[-1]
                del self.running[-1]
                bm.free(victim.seq_id)
                victim.status, victim.num_computed_tokens, victim.num_scheduled_tokens = "waiting", 0, 0
                self.waiting.appendleft(victim)
                preempted = True
                if victim is seq:
                    return True
            bm.append_slot(seq.seq_id)
            seq.num_scheduled_tokens = 1
            batch.append(seq)
            k += 1
        return preempted

    def _admit(self, batch):
        bm = self.block_manager
        used = len(batch)
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            ids = seq.token_ids
            cached = bm.cached_prefix_len(ids)
            if used + len(ids) - cached > self.max_num_batched_tokens or not bm.can_allocate(ids):
                return
            self.waiting.popleft()
            seq.num_computed_tokens = bm.allocate(seq.seq_id, ids)
            seq.num_scheduled_tokens = len(ids) - seq.num_computed_tokens
            seq.status = "running"
            self.running.append(seq)
            batch.append(seq)
            used += seq.num_scheduled_tokens

    def schedule(self):
        batch = []
        if not self._decode(batch):
            self._admit(batch)
        return batch

    def postprocess(self, batch, token_ids):
        if len(batch) != len(token_ids):
            raise ValueError("one token per sequence of the batch")
        done = []
        for seq, tok in zip(batch, token_ids):
            seq.num_computed_tokens, seq.num_scheduled_tokens = seq.num_computed_tokens + seq.num_scheduled_tokens, 0
            self.block_manager.cache_full_blocks(seq.seq_id, seq.token_ids[:seq.num_computed_tokens])
            seq.output.append(tok)
            if tok == seq.eos_token_id or len(seq.output) >= seq.max_new_tokens:
                seq.status = "finished"
                self.block_manager.free(seq.seq_id)
                self.running = [s for s in self.running if s is not seq]
                done.append(seq)
        return done

    def has_unfinished(self):
        return len(self.waiting) + len(self.running) > 0


def build_model_inputs(batch, block_tables, block_size):  # noqa: F811
    if len(batch) == 0 or len(block_tables) != len(batch):
        raise ValueError("an empty batch, or not one table per sequence")
    c = torch.tensor([s.num_computed_tokens for s in batch])
    n = torch.tensor([s.num_scheduled_tokens for s in batch])
    for s, t in zip(batch, block_tables):
        if s.num_scheduled_tokens < 1 or len(t) * block_size < s.num_computed_tokens + s.num_scheduled_tokens:
            raise ValueError(f"seq_id {s.seq_id}: nothing scheduled, or its table is too short")
    width = max(len(t) for t in block_tables)
    tables = torch.full((len(batch), width), -1, dtype=torch.int64)
    for i, t in enumerate(block_tables):
        tables[i, :len(t)] = torch.tensor(t, dtype=torch.int64)
    seq_of = torch.repeat_interleave(torch.arange(len(batch)), n)
    start = torch.cumsum(n, 0) - n
    pos = c[seq_of] + torch.arange(int(n.sum())) - start[seq_of]
    blocks = tables[seq_of, pos // block_size]
    ids = torch.tensor([t for s in batch for t in s.token_ids[s.num_computed_tokens:
                                                             s.num_computed_tokens + s.num_scheduled_tokens]])
    qsl = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(n, 0)])
    return ModelInputs(ids.long(), pos.long(), (blocks * block_size + pos % block_size).long(), qsl.long(),
                       (c + n).long(), tables)


class LLMEngine:  # noqa: F811
    def __init__(self, model, num_blocks, block_size, max_num_seqs=8, max_num_batched_tokens=256):
        self.model = model
        self.block_manager = BlockManager(num_blocks, block_size)
        self.scheduler = Scheduler(self.block_manager, max_num_seqs, max_num_batched_tokens)
        self.kv_cache = model.new_kv_cache(num_blocks, block_size)
        self.sequences = {}

    def _validate(self, prompt, n, eos):
        cfg = self.model.config
        if not isinstance(prompt, (list, tuple)) or any(type(t) is not int for t in prompt):
            raise TypeError("prompt must be a list of ints")
        if len(prompt) == 0 or n < 1 or min(prompt) < 0 or max(prompt) >= cfg.vocab_size:
            bad = [t for t in prompt if not 0 <= t < cfg.vocab_size]
            raise ValueError(f"bad request: token {bad[:1]} outside the vocabulary, an empty prompt or max_new_tokens={n}")
        if eos is not None and not 0 <= eos < cfg.vocab_size:
            raise ValueError(f"eos_token_id {eos} outside the vocabulary")
        if len(prompt) + n > cfg.max_seq_len:
            raise ValueError(f"longer than max_seq_len={cfg.max_seq_len}")
        k = len(prompt) + n - 1
        if k > self.scheduler.max_num_batched_tokens:
            raise ValueError("more tokens than max_num_batched_tokens")
        if -(-k // self.block_manager.block_size) > self.block_manager.num_blocks:
            raise ValueError("more blocks than num_blocks")

    def add_request(self, prompt, max_new_tokens, eos_token_id=None):
        self._validate(prompt, max_new_tokens, eos_token_id)
        sid = len(self.sequences)
        seq = Sequence(sid, list(prompt), max_new_tokens, eos_token_id)
        self.scheduler.add(seq)
        self.sequences[sid] = seq
        return sid

    def step(self):
        batch = self.scheduler.schedule()
        if not batch:
            return []
        B = self.block_manager.block_size
        ids, pos, slots, qsl, ctx, tables = [], [], [], [0], [], []
        for s in batch:
            table = self.block_manager.block_table(s.seq_id)
            lo, hi = s.num_computed_tokens, s.num_computed_tokens + s.num_scheduled_tokens
            ids += s.token_ids[lo:hi]
            pos += list(range(lo, hi))
            slots += [table[p // B] * B + p % B for p in range(lo, hi)]
            qsl.append(qsl[-1] + hi - lo)
            ctx.append(hi)
            tables.append(table)
        w = max(map(len, tables))
        inputs = ModelInputs(*[torch.tensor(v, dtype=torch.long) for v in
                               (ids, pos, slots, qsl, ctx, [t + [-1] * (w - len(t)) for t in tables])])
        with torch.no_grad():
            logits = self.model.forward(inputs, self.kv_cache)
        tokens = [int(i) for i in torch.argmax(logits, dim=1)]
        self.scheduler.postprocess(batch, tokens)
        return list(zip([s.seq_id for s in batch], tokens))

    def has_unfinished(self):
        return self.scheduler.has_unfinished()

    def generate(self, prompts, max_new_tokens, eos_token_id=None):
        limits = list(max_new_tokens) if isinstance(max_new_tokens, (list, tuple)) else [max_new_tokens] * len(prompts)
        for p, n in zip(prompts, limits):
            self._validate(p, n, eos_token_id)
        ids = [self.add_request(p, n, eos_token_id) for p, n in zip(prompts, limits)]
        outs = {}
        while self.has_unfinished():
            for sid, _ in self.step():
                if self.sequences[sid].status == "finished":
                    outs[sid] = list(self.sequences[sid].output)
        return [outs[i] for i in ids]
''')]
