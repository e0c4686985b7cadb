"""TRL's GRPO loss behind the contract (``rlconform audit --impl conformance_tests.adapters.trl:make``).
Line numbers: trl 1.16.0, ``trl/trainer/grpo_trainer.py``.

Every op runs ``GRPOTrainer._compute_loss`` (:3020), the one place TRL computes its loss types. It is
private and a method: a real trainer needs a model, a tokenizer, reward functions and a dataset, none of
which the loss reads. So it is called unbound on a stub holding what it reads (a real ``GRPOConfig``,
the attributes ``GRPOTrainer.__init__`` copies from it at :782-983, an identity accelerator) and a
``_get_per_token_logps_and_entropies`` that returns the given log-probs instead of running a model.

ccapo.policy_loss: ``loss_type="grpo"`` (per-sequence token mean, then batch mean, :3153) with ``beta``
(k3 KL, :3098); isreshape.sapo_weight(_signed): the per-token gradient of ``loss_type="sapo"`` (:3121) in
log π; isreshape.aggregate_loss: ``bnpo`` (token-mean) and ``grpo`` (seq-mean-token-mean) at ratio 1,
where the per-token loss is −A. ccapo.macro_advantage: TRL computes GRPO advantages inline in
``_generate_and_score_completions`` (:2324, the advantages at :2761-2810), so that method is called unbound on
a stub whose ``_generate`` returns one-token completions and whose ``_calculate_rewards`` returns the given
returns; the group statistics, the division and the NaN handling are TRL's lines.
"""
from __future__ import annotations

import types

from conformance_tests.adapters import left_out, seed_only
from conformance_tests.errors import NotApplicable

# The contract ops of the covered families (ccapo, isreshape) this adapter does not provide, and why.
LEFT_OUT = {
    **seed_only("ccapo", "isreshape"),
    "ccapo.ccapo_update": "GRPOTrainer.train needs a model, a tokenizer, a dataset and generation: no update of "
                          "given tensors",
    "isreshape.importance_ratio": "coef_1 = exp(log_ratio) is computed inline in _compute_loss (:3083-3095): "
                                  "reached through the losses (declared log_ratio_clamp none)",
    **left_out("SAPO's gate is inside the sapo loss: its weight is reached through isreshape.sapo_weight(_signed)",
               "isreshape.sapo_gate"),
}


def make() -> types.SimpleNamespace:
    import collections
    import tempfile

    import torch
    import trl
    from trl import GRPOConfig, GRPOTrainer

    # TRL's defaults, except the KL's importance weight (use_bias_correction_kl=True multiplies the k3 term by r,
    # :3104): off, so the KL is the seed's k3 of π_θ vs π_ref (CCAPO-PPO-2); the loss type is chosen per op
    args = GRPOConfig(output_dir=tempfile.mkdtemp(), use_cpu=True, bf16=False, report_to=[],
                      use_bias_correction_kl=False)

    def compute_loss(new, old, adv, mask, *, loss_type, ref=None, beta=0.0, eps=0.2, tau_pos=1.0, tau_neg=1.05):
        ident = lambda x, **_: x  # noqa: E731  one process: gather/reduce are the identity
        stub = types.SimpleNamespace(
            args=types.SimpleNamespace(**{**vars(args), "sapo_temperature_pos": tau_pos,
                                          "sapo_temperature_neg": tau_neg}),
            loss_type=loss_type, beta=beta, epsilon_low=eps, epsilon_high=eps, importance_sampling_level="token",
            top_entropy_quantile=1.0, off_policy_mask_threshold=None, use_vllm=False, aux_loss_enabled=False,
            _entropy_bonus_enabled=False, model=types.SimpleNamespace(training=False),
            current_gradient_accumulation_steps=1, max_completion_length=new.shape[-1],
            accelerator=types.SimpleNamespace(gather=ident, reduce=ident, gather_for_metrics=ident, num_processes=1),
            _metrics={"eval": collections.defaultdict(list)},
            _get_per_token_logps_and_entropies=lambda *a, **k: (new, torch.zeros_like(new), None))
        ids = torch.zeros(new.shape, dtype=torch.long)
        inputs = {"prompt_ids": ids[:, :1], "prompt_mask": ids[:, :1] + 1, "completion_ids": ids,
                  "completion_mask": mask.to(new.dtype), "advantages": adv, "old_per_token_logps": old,
                  "ref_per_token_logps": ref, "num_items_in_batch": mask.sum()}
        return GRPOTrainer._compute_loss(stub, None, inputs), stub._metrics["eval"]  # private: see above

    def policy_loss(logp_new, logp_old, logp_ref, advantages, mask, *, clip_eps=0.2, beta_kl=0.04):
        # old/ref log-probs reach the loss computed under torch.no_grad() (:2634), advantages from rewards
        logp_old, logp_ref, advantages = logp_old.detach(), logp_ref.detach(), advantages.detach()

        def run(beta):
            return compute_loss(logp_new, logp_old, advantages, mask, loss_type="grpo", ref=logp_ref, beta=beta,
                                eps=clip_eps)

        clip, metrics = run(0.0)
        kl = run(1.0)[0] - clip  # TRL adds β·KL per token before its per-sequence mean (:3150)
        loss = run(beta_kl)[0]
        return {"loss": loss, "loss_clip": clip, "loss_kl": loss - clip, "kl_ref": kl,
                "clip_fraction": torch.tensor(metrics["clip_ratio/region_mean"][0], dtype=logp_new.dtype)}

    def sapo_weight_signed(ratio, advantages, *, tau_pos, tau_neg):
        # SAPO's weight is the factor on each token's log-prob gradient (ISR-SAPO-1); TRL exposes the loss
        # only, so read it off the autograd gradient: one sequence of T tokens, A = ±1 (the sign picks τ)
        r = ratio.reshape(1, -1).detach()
        log_prob = torch.log(r).requires_grad_(True)
        sign = torch.where(advantages.reshape(1, -1) > 0, 1.0, -1.0).to(r.dtype)
        loss, _ = compute_loss(log_prob, torch.zeros_like(r), sign, torch.ones_like(r), loss_type="sapo",
                               tau_pos=tau_pos, tau_neg=tau_neg)
        (grad,) = torch.autograd.grad(loss, log_prob)
        return (-grad * sign * r.numel()).reshape(ratio.shape)  # undo the per-sequence token mean (:3154)

    def sapo_weight(ratio, *, tau=1.0):
        return sapo_weight_signed(ratio, torch.ones_like(ratio), tau_pos=tau, tau_neg=tau)

    def macro_advantage(returns, *, eps=1e-8):  # eps: TRL's own 1e-4 is the declared advantage_std convention
        # _generate_and_score_completions, multi_objective_aggregation "sum_then_normalize" and scale_rewards
        # "group" (GRPOConfig defaults): mean and nanstd (Bessel, trainer/utils.py:1021) per group of
        # num_generations, (r - mean) / (std + 1e-4), NaN -> 0 (:2761-2810). One reward function of weight 1.
        # The method is private and needs a generating model: it runs on a stub (see the module docstring).
        if returns.dim() == 0:
            raise NotApplicable("TRL scores completions in groups: a 0-d return has no group to hand it")
        flat = returns.flatten(0, -2) if returns.dim() > 1 else returns.unsqueeze(0)
        out = GRPOTrainer._generate_and_score_completions(scoring_stub(flat), [{"prompt": ""}] * flat.numel())
        return out["advantages"].reshape(returns.shape)

    def scoring_stub(flat):
        ident, ids = (lambda x, **_: x), [[0]] * flat.numel()  # noqa: E731  one process, one-token completions
        return types.SimpleNamespace(
            args=args, accelerator=types.SimpleNamespace(device=flat.device, gather=ident, process_index=0,
                                                         num_processes=1),
            model=types.SimpleNamespace(training=True, is_gradient_checkpointing=False),
            environment_factories=None, tools=None, environments=None, use_vllm=False, beta=0.0,
            num_iterations=args.num_iterations, num_generations=flat.shape[-1], num_generations_eval=flat.shape[-1],
            _generate=lambda prompts: (ids, ids, None, [""] * len(prompts), None, {}, None, None),
            _tokenizer=types.SimpleNamespace(pad_token_id=0), pad_to_multiple_of=None, mask_truncated_completions=False,
            # _calculate_rewards (:1579) fills a float32 [N, n_funcs] table; here the caller's returns in their dtype
            _calculate_rewards=lambda *a: flat.reshape(-1, 1).detach(),
            multi_objective_aggregation=args.multi_objective_aggregation, scale_rewards=args.scale_rewards,
            reward_weights=torch.ones(1, dtype=torch.float32, device=flat.device), reward_func_names=["reward"],
            _metrics={"train": collections.defaultdict(list)}, _pending_extra_logs={}, _pending_metrics={},
            _logs={"prompt": [], "completion": [], "advantages": [], "rewards": collections.defaultdict(list),
                   "extra": collections.defaultdict(list)}, log_multimodal=False)

    def aggregate_loss(loss_mat, mask, *, mode="token-mean"):
        loss_type = {"token-mean": "bnpo", "seq-mean-token-mean": "grpo"}.get(mode)
        if loss_type is None:  # luspo sums per sequence but counts empty rows; no token-sum type
            raise NotApplicable(f"no TRL loss type aggregates as {mode!r}")
        z = torch.zeros_like(loss_mat)  # ratio 1: TRL's per-token loss is -min(A, A) = -A (:3112-3120)
        return compute_loss(z, z, -loss_mat, mask, loss_type=loss_type)[0]

    capabilities = {
        "dtypes": ["float32", "float64"], "terminated_truncated": False,
        "train_dtype": "float32",  # GRPO trains in bf16/fp32, never float64: float64 findings are labelled so
        "differentiable": ["ccapo.policy_loss", "isreshape.aggregate_loss"],
        "conventions": {
            "clip_fraction": "active_clips",  # clip_ratio/region_mean: r<1-ε with A<0 or r>1+ε with A>0 (:3274-3276)
            "log_ratio_clamp": "none",  # coef_1 = exp(log_ratio), no clamp (:3083-3095)
            "advantage_std": {"ddof": 1, "eps": 1e-4, "eps_mode": "add"},  # nanstd (Bessel) + 1e-4, :2771, :2787
        },
    }
    return types.SimpleNamespace(name="TRL GRPOTrainer._compute_loss", version=trl.__version__,
                                 capabilities=capabilities,
                                 ccapo=types.SimpleNamespace(policy_loss=policy_loss, macro_advantage=macro_advantage),
                                 isreshape=types.SimpleNamespace(sapo_weight=sapo_weight,
                                                                 sapo_weight_signed=sapo_weight_signed,
                                                                 aggregate_loss=aggregate_loss))
