"""Another ``__init__`` style (issue "Graders that charge one deviation once", item 4): ``MoE.__init__`` takes extra
keyword-only options, torch's factory keywords (``device``, ``dtype``, passed to every layer, as ``nn.Linear`` does)
and the expert class; ``ExpertParallelMoE.__init__(moe, group=None)`` shards the MoE itself (the stub's given
``__init__`` takes the router and experts), ``from_moe`` only calls it. The graders build ``MoE(d, d_ff, E, k=...,
capacity_factor=...)`` and ``ExpertParallelMoE`` only through ``from_moe``: both calls bind, so it must lose nothing
(it fails every test while the harness's API check compares signatures with the stub's instead of binding the
graders' calls)."""
MAY_FAIL = []
SELECT = "moe_matches or moe_gradients or moe_aux or rejects_x or expert_parallel_equals or rank_holds or not_divisible"
MUTATE = [
    ("""    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False)
        self.w3 = nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)
""", """    def __init__(self, d_model: int, d_ff: int, *, device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.w1 = nn.Linear(d_model, d_ff, bias=False, **factory)
        self.w3 = nn.Linear(d_model, d_ff, bias=False, **factory)
        self.w2 = nn.Linear(d_ff, d_model, bias=False, **factory)
"""),
    ("""    def __init__(self, d_model: int, d_ff: int, num_experts: int, k: int = 2, capacity_factor: float | None = None):
        super().__init__()
""", """    def __init__(self, d_model: int, d_ff: int, num_experts: int, k: int = 2, capacity_factor: float | None = None,
                 *, expert_cls: type = Expert, device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
"""),
    ("""        self.router = nn.Linear(d_model, num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(d_model, d_ff) for _ in range(num_experts))
""", """        self.router = nn.Linear(d_model, num_experts, bias=False, **factory)
        self.experts = nn.ModuleList(expert_cls(d_model, d_ff, **factory) for _ in range(num_experts))
"""),
    ("""    def __init__(self, router: nn.Linear, experts: nn.ModuleList, num_experts: int, k: int,
                 capacity_factor: float | None, group):
        super().__init__()
        self.router, self.experts = router, experts
        self.num_experts, self.k, self.capacity_factor, self.group = num_experts, k, capacity_factor, group

    @classmethod
    def from_moe(cls, moe: MoE, group=None) -> "ExpertParallelMoE":
        W, r = dist.get_world_size(group), dist.get_rank(group)
        E = len(moe.experts)
        if E % W:
            raise ValueError(f"num_experts={E} is not divisible by the group's size W={W}")
        n = E // W
        experts = nn.ModuleList(copy.deepcopy(moe.experts[j]) for j in range(r * n, (r + 1) * n))
        return cls(copy.deepcopy(moe.router), experts, E, moe.k, moe.capacity_factor, group)
""", """    def __init__(self, moe: MoE, group=None):
        super().__init__()
        W, r = dist.get_world_size(group), dist.get_rank(group)
        E = len(moe.experts)
        if E % W:
            raise ValueError(f"num_experts={E} is not divisible by the group's size W={W}")
        n = E // W
        self.router = copy.deepcopy(moe.router)
        self.experts = nn.ModuleList(copy.deepcopy(moe.experts[j]) for j in range(r * n, (r + 1) * n))
        self.num_experts, self.k, self.capacity_factor, self.group = E, moe.k, moe.capacity_factor, group

    @classmethod
    def from_moe(cls, moe: MoE, group=None) -> "ExpertParallelMoE":
        return cls(moe, group)
"""),
]
