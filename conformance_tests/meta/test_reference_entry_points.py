"""Meta-tests of the reference's entry points as a caller meets them: a batch that lacks a field, or a
schedule argument outside its range, is refused by name, and a keyword left out takes the value of the
family's defaults table.

The contract passes every batch field and coefficient, so the clause tests never reach these; a caller of
the reference (a trainer, an adapter's author reading it) does.
"""
from __future__ import annotations

import importlib
import inspect
import math
import pkgutil

import pytest
import torch

from reference_impl.ccapo import advantages as ccapo_advantages
from reference_impl.ccapo import scoring as ccapo_scoring
from reference_impl.ccapo import update as ccapo_update
from reference_impl.ppo import advantage as ppo_advantage
from reference_impl.ppo import loss_level as ppo_loss_level
from reference_impl.ppo import update as ppo_update
from reference_impl.sac import data as sac_data
from reference_impl.sac import loss_level as sac_loss_level
from reference_impl.sac import negatives as sac_negatives
from reference_impl.sac import reward as sac_reward
from reference_impl.sac import step as sac_step
from reference_impl.sac import updates as sac_updates

pytestmark = pytest.mark.meta
ppo_losses = importlib.import_module("reference_impl.ppo.losses")  # the package attribute is loss_level's losses

# (entry point, the fields it needs, the clause its refusal names); the batch is the only argument read
# before the refusal, so the others are placeholders.
ENTRY_POINTS = {
    "sac.loss_level.losses": (lambda b: sac_loss_level.losses(None, None, None, b, log_alpha=None, gamma=0.9),
                              sac_loss_level.LOSSES_BATCH_KEYS, "SAC-LOSSES-1"),
    "sac.step.update_step": (lambda b: sac_step.update_step(None, None, None, None, {}, b),
                             sac_step.BATCH_KEYS, "SAC-STEP-1"),
    "ppo.loss_level.losses": (lambda b: ppo_loss_level.losses(None, None, b), ppo_loss_level.LOSSES_BATCH_KEYS,
                              "PPO-LOSSES-1"),
    "ppo.update.ppo_update": (lambda b: ppo_update.ppo_update(None, None, None, b, epochs=1, minibatch_size=1,
                                                              clip_eps=0.2, vf_coef=0.5, ent_coef=0.01,
                                                              max_grad_norm=0.5, target_kl=None),
                              ppo_update.REQUIRED, "PPO-INPUT-5"),
    "ccapo.update.ccapo_update": (lambda b: ccapo_update.make_ccapo_update()(None, None, None, b),
                                  ccapo_update.REQUIRED, "CCAPO-UPDATE-1"),
}


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_a_batch_missing_a_field_is_refused_by_name(name):
    call, keys, clause = ENTRY_POINTS[name]
    dropped = keys[len(keys) // 2]
    with pytest.raises(ValueError, match=rf"^\[{clause}\] batch lacks field\(s\) \['{dropped}'\]$"):
        call({k: None for k in keys if k != dropped})


@pytest.mark.parametrize("call, clause", [
    (lambda: sac_data.mix_counts(8, rho=1.5), "SAC-MIX-1"),
    (lambda: sac_data.mix_counts(8, rho=1.0), "SAC-MIX-1"),  # no demo row: V2 always mixes in the teacher
    (lambda: sac_data.mix_counts(8, rho=0.0), "SAC-MIX-1"),
    (lambda: sac_data.dagger_teacher_ratio(-1, horizon=10), "SAC-DAGGER-1"),
    (lambda: sac_data.dagger_teacher_ratio(0, horizon=0), "SAC-DAGGER-1"),
], ids=["rho-1.5", "rho-1", "rho-0", "step-negative", "horizon-0"])
def test_a_schedule_argument_out_of_range_is_refused_by_name(call, clause):
    with pytest.raises(ValueError, match=rf"^\[{clause}\]"):
        call()


def test_ppo_update_refuses_no_epoch_on_its_own():
    batch = {"obs": torch.zeros(2, 1), "action": torch.zeros(2, dtype=torch.long), "old_log_prob": torch.zeros(2),
             "mask": torch.ones(2, 3, dtype=torch.bool), "advantage": torch.zeros(2), "return": torch.zeros(2)}
    with pytest.raises(ValueError, match=r"^\[PPO-INPUT-4\]"):
        ppo_update.ppo_update(None, None, None, batch, epochs=0, minibatch_size=1, clip_eps=0.2, vf_coef=0.5,
                              ent_coef=0.01, max_grad_norm=0.5, target_kl=None)


@pytest.mark.parametrize("call", [
    lambda: ccapo_scoring.importance(torch.ones(2), torch.ones(2), alpha_smooth=math.inf),
    lambda: ccapo_scoring.distance_decay(torch.ones(2), distance_exponent=math.inf),
    lambda: ccapo_scoring.q_stdb(torch.ones(2), torch.ones(2), torch.ones(2), lam=math.inf),
], ids=["alpha_smooth", "distance_exponent", "lam"])
def test_an_infinite_scoring_hyper_parameter_is_refused_by_name(call):
    """CCAPO-INPUT-5 names the non-positive ones; the reference refuses an infinite one too (it would score every
    edge 1 or 0, silently)."""
    with pytest.raises(ValueError, match=r"^\[CCAPO-INPUT-5\]"):
        call()


@pytest.mark.parametrize("call, clause", [
    (lambda: ppo_losses.normalize_advantages(torch.arange(3.0), eps=math.inf), "PPO-INPUT-4"),
    (lambda: ppo_losses.normalize_advantages(torch.arange(3.0), clamp=math.inf), "PPO-INPUT-4"),
    (lambda: ppo_losses.kl_early_stop(0.01, target_kl=math.inf), "PPO-INPUT-4"),
    (lambda: ppo_losses.kl_early_stop(0.01, factor=math.inf), "PPO-INPUT-4"),
    (lambda: ppo_losses.scale_reward(torch.ones(2), scale=math.inf), "PPO-INPUT-4"),
    (lambda: ppo_losses.entropy_trend(torch.ones(2, 3)), "PPO-INPUT-4"),
    (lambda: sac_updates.soft_update(torch.zeros(2), torch.ones(2), tau=1.5), "SAC-TARGET-1"),
    (lambda: sac_updates.soft_update_([torch.zeros(2)], [torch.ones(2)], tau=1.5), "SAC-TARGET-1"),
    (lambda: sac_updates.ema_update(torch.zeros(2), torch.ones(2), m=1.5), "SAC-NCE-3"),
    (lambda: sac_updates.ema_update(torch.zeros(2), torch.ones(2), m=1.0), "SAC-NCE-3"),
    (lambda: sac_updates.popart_step(torch.zeros(()), torch.ones(()), torch.ones(3), beta=1.5), "SAC-POPART-1"),
    (lambda: sac_negatives.nce_queue_push(torch.zeros(2, 3), torch.ones(1, 3), capacity=0), "SAC-NCE-4"),
    (lambda: sac_reward.ngram_coverage("abcd", "abcd", n=0, window=4), "SAC-COV-1"),
    (lambda: sac_reward.ngram_coverage("abcd", "abcd", n=3, window=2), "SAC-COV-1"),
    (lambda: ccapo_advantages.micro_advantage(torch.ones(2, 3), sigma_min=math.inf), "CCAPO-INPUT-5"),
], ids=["adv-eps-inf", "adv-clamp-inf", "target_kl-inf", "kl-factor-inf", "reward-scale-inf", "entropy-2d",
        "tau-1.5", "tau-1.5-foreach", "m-1.5", "m-1", "popart-beta-1.5", "nce-capacity-0", "ngram-n-0",
        "window-below-n", "sigma_min-inf"])
def test_a_setting_outside_the_references_range_is_refused_by_name(call, clause):
    """Settings the clauses use but give no range for, refused where they would silently degrade the result:
    an infinite floor, clamp, threshold or scale (every value then passes or becomes 0), an average that
    never moves (m = 1) or overshoots (a rate above 1), an empty negatives queue, a coverage of empty n-grams."""
    with pytest.raises(ValueError, match=rf"^\[{clause}\]"):
        call()


def test_integer_macro_returns_are_promoted_not_refused():
    """Returns counted in whole units of R_terminal are a valid group: the same advantages as the floats."""
    ints = torch.tensor([[1, 3, 5, 0]])
    assert torch.equal(ccapo_advantages.macro_advantage(ints), ccapo_advantages.macro_advantage(ints.double()))


@pytest.mark.parametrize("name", ["a_macro", "a_micro"])
def test_fusion_names_the_advantage_that_is_not_finite(name):
    adv = {"a_macro": torch.zeros(2), "a_micro": torch.zeros(2, 3)}
    adv[name] = adv[name].clone().fill_(math.inf)
    with pytest.raises(ValueError, match=rf"^\[CCAPO-INPUT-1\] {name} contains NaN or inf$"):
        ccapo_advantages.fuse_advantages(adv["a_macro"], adv["a_micro"])


def test_fusion_refuses_an_infinite_beta():
    with pytest.raises(ValueError, match=r"^\[CCAPO-INPUT-5\] beta=inf"):
        ccapo_advantages.fuse_advantages(torch.zeros(2), torch.zeros(2, 3), beta=math.inf)


@pytest.mark.parametrize("negative", ["importance", "criticality", "distance"])
def test_a_negative_scoring_factor_is_refused_naming_it(negative):
    factors = {name: torch.ones(2) for name in ("importance", "criticality", "distance")}
    factors[negative] = torch.tensor([1.0, -0.5])
    with pytest.raises(ValueError, match=rf"^\[CCAPO-INPUT-2\] {negative} is negative$"):
        ccapo_scoring.q_stdb(factors["importance"], factors["criticality"], factors["distance"])


def _gae(**change):
    t = torch.zeros(2, 3)
    args = {"reward": t, "value": t, "next_value": t, "done": torch.zeros(2, 3, dtype=torch.bool), **change}
    kwargs = {k: args.pop(k) for k in ("gamma", "lam", "truncated") if k in args}
    return ppo_advantage.gae(args["reward"], args["value"], args["next_value"], args["done"],
                             **{"gamma": 0.99, "lam": 0.95, **kwargs})


@pytest.mark.parametrize("name", ["reward", "value", "next_value"])
def test_gae_names_the_input_that_is_not_finite(name):
    bad = torch.zeros(2, 3)
    bad[1, 2] = math.nan
    with pytest.raises(ValueError, match=rf"^\[PPO-GAE-1\] {name} contains NaN or inf$"):
        _gae(**{name: bad})


@pytest.mark.parametrize("change, match", [
    ({"gamma": 1.5}, r"^\[PPO-GAE-1\] gamma=1.5"), ({"lam": 1.5}, r"^\[PPO-GAE-1\] lam=1.5"),
    ({"truncated": torch.zeros(2, 2, dtype=torch.bool)}, r"^\[PPO-GAE-2\] shapes differ: \{'truncated': \(2, 2\)"),
], ids=["gamma-above-1", "lambda-above-1", "truncated-shape"])
def test_gae_refuses_a_setting_or_flag_out_of_place_by_name(change, match):
    with pytest.raises(ValueError, match=match):
        _gae(**change)


def _ccapo_batch(n: int = 2, t: int = 3, actions: int = 4) -> dict:
    return {"obs": torch.zeros(n, t, 1), "legal": torch.ones(n, t, actions, dtype=torch.bool),
            "action": torch.zeros(n, t, dtype=torch.long), "logp_old": torch.zeros(n, t),
            "advantage": torch.zeros(n, t), "mask": torch.ones(n, t, dtype=torch.bool)}


@pytest.mark.parametrize("change, kwargs, clause", [
    ({"advantage": torch.zeros(2)}, {}, "CCAPO-UPDATE-1"),  # one value per trajectory, not per step
    ({"mask": torch.ones(3, 3, dtype=torch.bool)}, {}, "CCAPO-UPDATE-1"),  # another number of trajectories
    ({}, {"max_grad_norm": 0.0}, "CCAPO-INPUT-5"),
    ({}, {"epochs": 0}, "CCAPO-INPUT-5"),
    ({}, {"minibatch_size": 0}, "CCAPO-INPUT-5"),
], ids=["per-trajectory-field", "trajectory-count", "zero-clip-norm", "no-epoch", "empty-minibatch"])
def test_ccapo_update_refuses_a_misshapen_batch_or_a_setting_out_of_range(change, kwargs, clause):
    """Refused before any network runs (the policies here are placeholders)."""
    with pytest.raises(ValueError, match=rf"^\[{clause}\]"):
        ccapo_update.make_ccapo_update()(None, None, None, {**_ccapo_batch(), **change}, **kwargs)


def test_the_reference_provides_every_operation_of_every_contract():
    import reference_impl
    from conformance_tests import contract

    impl = reference_impl.make()
    missing = [f"{family}.{name}" for family in ("sac", "ppo", "isreshape", "ccapo")
               for name in contract.op_names(family) if not callable(getattr(getattr(impl, family), name, None))]
    assert not missing, f"operations the reference does not provide: {missing}"


def test_the_operations_take_the_contracts_keyword_defaults():
    """Each operation the reference exposes to the suite takes, for every keyword the contract gives a default,
    that same default (a caller reading the contract gets what it says)."""
    import reference_impl
    from conformance_tests import contract

    impl, checked, wrong = reference_impl.make(), 0, []
    for family in ("sac", "ppo", "isreshape", "ccapo"):
        ops = getattr(impl, family)
        for name, proto in inspect.getmembers(contract.protocol(family), inspect.isfunction):
            if name.startswith("_") or not hasattr(ops, name):
                continue
            ours = inspect.signature(getattr(ops, name)).parameters
            for key, p in inspect.signature(proto).parameters.items():
                if p.default is not inspect.Parameter.empty and key in ours:
                    checked += 1
                    if ours[key].default != p.default:
                        wrong.append(f"{family}.{name}({key}={ours[key].default!r}): the contract says {p.default!r}")
    assert checked >= 90, f"only {checked} keyword defaults compared: the walk misses operations"
    assert not wrong, "\n".join(wrong)


# Keywords whose name is a defaults-table key but whose default is deliberately another value, and why.
NOT_THE_TABLE = {
    ("reference_impl.sac.loss_level", "losses", "top_p"):
        "the library-level call computes the full legal-set expectation by default (p = 1), as TorchRL does",
    ("reference_impl.sac.reward", "info_nce", "tau"):
        "the InfoNCE temperature; the table's tau is the soft target update rate (nce_tau is this one)",
    ("reference_impl.ccapo.textworld.gigpo", "anchor_group_advantage", "eps"):
        "GiGPO is a baseline beside CCAPO, not one of its formulas; its ε is its own (the module's docstring)",
}


ALIASES = {"lam_cql": "lambda_cql", "lam_bc": "lambda_bc"}  # short keyword names of table keys


def _keyword_defaults():
    """(module, function, keyword, default, table value) for every keyword default of a reference function
    whose name (or its ALIASES entry) is a key of its family's defaults table."""
    for family in ("sac", "ppo", "isreshape", "ccapo"):
        table = importlib.import_module(f"reference_impl.{family}.defaults").DEFAULTS
        pkg = importlib.import_module(f"reference_impl.{family}")
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if info.name.endswith("__main__"):
                continue
            module = importlib.import_module(info.name)
            for fname, fn in vars(module).items():
                if not inspect.isfunction(fn) or fn.__module__ != module.__name__:
                    continue
                for p in inspect.signature(fn).parameters.values():
                    key = ALIASES.get(p.name, p.name)
                    if p.default is not inspect.Parameter.empty and key in table:
                        yield module.__name__, fname, p.name, p.default, table[key]


def test_keyword_defaults_take_the_defaults_table():
    """A keyword a caller leaves out gets the document's value (PPO's clip 0.2, SAC's κ 0.9, ...), except
    where NOT_THE_TABLE says why not; each exception is still there (none goes stale)."""
    found = list(_keyword_defaults())
    assert len(found) >= 15, f"only {len(found)} keyword defaults found: the walk misses modules"
    wrong = [f"{m}.{f}({k}={d!r}): the table says {t!r}" for m, f, k, d, t in found
             if d != t and (m, f, k) not in NOT_THE_TABLE]
    assert not wrong, "keyword defaults that differ from the defaults table:\n" + "\n".join(wrong)
    stale = set(NOT_THE_TABLE) - {(m, f, k) for m, f, k, d, t in found if d != t}
    assert not stale, f"exceptions that no longer apply: {sorted(stale)}"
