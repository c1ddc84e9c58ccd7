"""Parts A and B in nano-vllm's style (GeeeekExplorer/nano-vllm ``engine/block_manager.py``, ``scheduler.py``),
brought to the contract: ``Block`` objects carrying their reference count, key and tokens; a ``deque`` of free
block ids (a hit removes its block from the middle with ``deque.remove``); keys chained as nano-vllm's
``compute_hash(token_ids, prefix)``, a hit confirmed on the block's own tokens; the first block offered keeps an
entry (where nano-vllm lets the last win); a Scheduler with nano-vllm's ``preempt`` helper but the contract's mixed
step (decode, then admission). The engine runs ``step`` under ``torch.inference_mode``. Proves: another block
representation, queue type and key scheme score full marks."""
MAY_FAIL = []
MUTATE = [("        return [list(self.sequences[i].output) for i in ids]\n",
           "        return [list(self.sequences[i].output) for i in ids]\n" '''

# --- the variant: nano-vllm's block manager and scheduler, to the contract --------------------------

class Block:
    def __init__(self, block_id):
        self.block_id, self.ref_count, self.hash, self.token_ids = block_id, 0, -1, []


def compute_hash(token_ids, prefix=-1):
    return hash((prefix, tuple(token_ids)))


class BlockManager:  # noqa: F811 - replaces the reference's
    def __init__(self, num_blocks: int, block_size: int):
        if not isinstance(num_blocks, int) or num_blocks <= 0:
            raise ValueError(f"num_blocks must be >= 1: {num_blocks!r}")
        if not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be >= 1: {block_size!r}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block_id = {}
        self.free_block_ids_ = deque(range(num_blocks))
        self.tables, self.slots, self.offered = {}, {}, {}

    num_free_blocks = property(lambda self: len(self.free_block_ids_))

    def _table(self, seq_id):
        if seq_id not in self.tables:
            raise ValueError(f"no sequence {seq_id!r}")
        return self.tables[seq_id]

    def _lookup(self, token_ids):
        B, h, hit = self.block_size, -1, []
        for i in range((len(token_ids) - 1) // B):
            chunk = token_ids[i * B:(i + 1) * B]
            h = compute_hash(chunk, h)
            block_id = self.hash_to_block_id.get(h, -1)
            if block_id == -1 or self.blocks[block_id].token_ids != chunk:
                break
            hit.append(block_id)
        return hit

    def _allocate_block(self):
        block = self.blocks[self.free_block_ids_.popleft()]
        if block.hash != -1:
            del self.hash_to_block_id[block.hash]
            block.hash, block.token_ids = -1, []
        block.ref_count = 1
        return block.block_id

    def cached_prefix_len(self, token_ids):
        return len(self._lookup(token_ids)) * self.block_size

    def can_allocate(self, token_ids):
        hit = self._lookup(token_ids)
        return (len(token_ids) + self.block_size - 1) // self.block_size \\
            - sum(self.blocks[b].ref_count > 0 for b in hit) <= len(self.free_block_ids_)

    def allocate(self, seq_id, token_ids):
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id!r} already has blocks")
        if not token_ids:
            raise ValueError("no tokens")
        if not self.can_allocate(token_ids):
            raise NoFreeBlocksError(f"num_blocks={self.num_blocks} exhausted")
        table = self._lookup(token_ids)
        for b in table:
            if self.blocks[b].ref_count == 0:
                self.free_block_ids_.remove(b)
            self.blocks[b].ref_count += 1
        cached = len(table)
        table += [self._allocate_block() for _ in range((len(token_ids) + self.block_size - 1) // self.block_size
                                                         - cached)]
        self.tables[seq_id], self.slots[seq_id], self.offered[seq_id] = table, len(token_ids), cached
        return cached * self.block_size

    def can_append(self, seq_id):
        self._table(seq_id)
        return self.slots[seq_id] % self.block_size or bool(self.free_block_ids_)

    def append_slot(self, seq_id):
        table = self._table(seq_id)
        p = self.slots[seq_id]
        if p % self.block_size == 0:
            if not self.free_block_ids_:
                raise NoFreeBlocksError("no free block")
            table.append(self._allocate_block())
        self.slots[seq_id] = p + 1
        return table[p // self.block_size] * self.block_size + p % self.block_size

    def cache_full_blocks(self, seq_id, token_ids):
        table, B = self._table(seq_id), self.block_size
        if len(token_ids) > self.slots[seq_id]:
            raise ValueError("more tokens than slots")
        h = -1
        for i in range(len(token_ids) // B):
            chunk = token_ids[i * B:(i + 1) * B]
            h = compute_hash(chunk, h)
            if i < self.offered[seq_id]:
                continue
            if h not in self.hash_to_block_id:
                block = self.blocks[table[i]]
                block.hash, block.token_ids = h, list(chunk)
                self.hash_to_block_id[h] = block.block_id
            self.offered[seq_id] = i + 1

    def free(self, seq_id):
        for b in reversed(self._table(seq_id)):
            block = self.blocks[b]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids_.append(b)
        del self.tables[seq_id], self.slots[seq_id], self.offered[seq_id]

    def free_block_ids(self):
        return list(self.free_block_ids_)

    def _block(self, block_id):
        if not isinstance(block_id, int) or not 0 <= block_id < self.num_blocks:
            raise ValueError(f"block_id {block_id!r} out of range")
        return self.blocks[block_id]

    def ref_count(self, block_id):
        return self._block(block_id).ref_count

    def is_cached(self, block_id):
        return self._block(block_id).hash != -1

    def block_table(self, seq_id):
        return list(self._table(seq_id))

    def num_slots(self, seq_id):
        self._table(seq_id)
        return self.slots[seq_id]


class Scheduler:  # noqa: F811
    def __init__(self, block_manager, max_num_seqs, max_num_batched_tokens):
        if not isinstance(max_num_seqs, int) or max_num_seqs < 1:
            raise ValueError(f"max_num_seqs: {max_num_seqs!r}")
        if not isinstance(max_num_batched_tokens, int) or max_num_batched_tokens < max_num_seqs:
            raise ValueError(f"max_num_batched_tokens: {max_num_batched_tokens!r}")
        self.block_manager = block_manager
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.waiting: deque = deque()
        self.running: list = []

    def add(self, seq):
        K = len(seq.prompt) + seq.max_new_tokens - 1
        if K > self.max_num_batched_tokens:
            raise ValueError(f"K={K} > max_num_batched_tokens")
        if -(-K // self.block_manager.block_size) > self.block_manager.num_blocks:
            raise ValueError(f"K={K} needs more than num_blocks")
        self.waiting.append(seq)

    def preempt(self, seq):
        seq.status, seq.num_computed_tokens, seq.num_scheduled_tokens = "waiting", 0, 0
        self.block_manager.free(seq.seq_id)
        self.waiting.appendleft(seq)

    def schedule(self):
        scheduled, preempted, num_batched_tokens = [], False, 0
        for seq in list(self.running):
            if seq not in self.running:
                break
            while not self.block_manager.can_append(seq.seq_id):
                preempted = True
                victim = self.running.pop()
                self.preempt(victim)
                if victim is seq:
                    break
            else:
                self.block_manager.append_slot(seq.seq_id)
                seq.num_scheduled_tokens = 1
                num_batched_tokens += 1
                scheduled.append(seq)
                continue
            break
        while not preempted and self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            num_new = seq.num_tokens - self.block_manager.cached_prefix_len(seq.token_ids)
            if num_batched_tokens + num_new > self.max_num_batched_tokens or \\
                    not self.block_manager.can_allocate(seq.token_ids):
                break
            seq.num_computed_tokens = self.block_manager.allocate(seq.seq_id, seq.token_ids)
            seq.num_scheduled_tokens, seq.status = num_new, "running"
            num_batched_tokens += num_new
            self.running.append(self.waiting.popleft())
            scheduled.append(seq)
        return scheduled

    def postprocess(self, seqs, token_ids):
        if len(seqs) != len(token_ids):
            raise ValueError(f"{len(token_ids)} tokens for {len(seqs)} sequences")
        finished = []
        for seq, token_id in zip(seqs, token_ids):
            seq.num_computed_tokens += seq.num_scheduled_tokens
            seq.num_scheduled_tokens = 0
            self.block_manager.cache_full_blocks(seq.seq_id, seq.token_ids[:seq.num_computed_tokens])
            seq.output.append(token_id)
            if (seq.eos_token_id is not None and token_id == seq.eos_token_id) or \\
                    len(seq.output) == seq.max_new_tokens:
                seq.status = "finished"
                self.block_manager.free(seq.seq_id)
                self.running.remove(seq)
                finished.append(seq)
        return finished

    def has_unfinished(self):
        return bool(self.running) or bool(self.waiting)


_reference_step = LLMEngine.step
LLMEngine.step = torch.inference_mode()(_reference_step)
''')]
