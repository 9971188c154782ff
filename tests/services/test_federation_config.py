"""federation.yaml: validation messages and the config hash every call carries."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from capc_common.errors import InputError
from capc_common.federation import FederationConfig


def test_hash_is_stable_across_save_and_load(tmp_path: Path, federation_dict) -> None:
    config = FederationConfig.from_dict(federation_dict())
    config.save(tmp_path / "f.yaml")
    again = FederationConfig.load(tmp_path / "f.yaml")
    assert again == config
    assert again.config_hash() == config.config_hash()
    assert len(config.config_hash()) == 64


@pytest.mark.parametrize(
    "change",
    [
        {"mechanism": {"threshold": 4, "sigma1": 2.0, "sigma2": 1.0}},
        {"budget": {"epsilon": 5.0, "delta": 1e-6, "order": 10}},
        {"teachers": [{"name": "hospital-a", "heads": 3}, {"name": "hospital-b", "heads": 3}]},
        {"classes": 9},
    ],
)
def test_any_parameter_change_changes_the_hash(federation_dict, change: dict[str, object]) -> None:
    base = FederationConfig.from_dict(federation_dict())
    assert FederationConfig.from_dict(federation_dict(**change)).config_hash() != base.config_hash()


def test_roles_and_heads(federation_dict) -> None:
    config = FederationConfig.from_dict(federation_dict())
    assert config.total_heads == 5
    assert config.teacher_names == ("hospital-a", "hospital-b")
    assert [config.role_of(n) for n in ("guardian", "student", "hospital-b", "x")] == [
        "guardian",
        "student",
        "teacher",
        None,
    ]
    with pytest.raises(InputError, match="not a teacher party"):
        config.teacher("x")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            {"quorum": {"min_parties": 3, "vote_deadline_s": 1, "share_deadline_s": 1}},
            "exceeds the 2 teacher",
        ),
        ({"teachers": [{"name": "student", "heads": 1}]}, "repeated"),
        ({"teachers": [{"name": "Bad Name", "heads": 1}]}, "DNS label"),
        ({"budget": {"epsilon": 1, "delta": 1e-5, "order": 1}}, r"budget\.order"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_invalid_configs_name_the_problem(federation_dict, change: dict[str, object], match: str) -> None:
    with pytest.raises(InputError, match=match):
        FederationConfig.from_dict(federation_dict(**change))


def test_batch_size_must_be_a_multiple_of_bn_batch(federation_dict) -> None:
    queries = dict(federation_dict()["queries"])  # type: ignore[arg-type]
    queries["batch_size"] = 40
    with pytest.raises(InputError, match="not a multiple of bn_batch 16"):
        FederationConfig.from_dict(federation_dict(queries=queries))


def test_missing_file_is_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        FederationConfig.load(tmp_path / "nope.yaml")


def test_revocations_are_normalised_and_leave_the_hash_alone(tmp_path: Path, federation_dict) -> None:
    """Revoking a certificate changes who may connect, not what is computed: the ledger, label store and
    cap records (all pinned to the hash) carry on. A federation without the section hashes as before."""
    base = FederationConfig.from_dict(federation_dict())
    revoked = [{"serial": "0x00:5F:A3", "party": "hospital-a"}, {"serial": "abc"}]
    config = FederationConfig.from_dict(federation_dict(revoked=revoked))
    assert config.revoked_serials == {"5fa3", "abc"}
    assert config.config_hash() == base.config_hash()
    assert "revoked" not in config.canonical_json()
    config.save(tmp_path / "f.yaml")
    assert FederationConfig.load(tmp_path / "f.yaml").revoked == config.revoked
    assert config.party_names == ("guardian", "student", "hospital-a", "hospital-b")


@pytest.mark.parametrize("serial", ["xyz", "1" * 41, ""])
def test_a_revoked_serial_must_be_hex(federation_dict, serial: str) -> None:
    with pytest.raises(InputError, match=r"revoked\.0\.serial.*serial number in hex"):
        FederationConfig.from_dict(federation_dict(revoked=[{"serial": serial}]))


KNN = {"name": "private-knn", "sigma": 3.0, "neighbours": 4, "sampling_rate": 0.25}
FOUR_VOTES = [{"name": "hospital-a", "heads": 4}, {"name": "hospital-b", "heads": 4}]


def test_confident_gnmax_hashes_as_before_the_mechanism_union(federation_dict) -> None:
    """The hashes of the test federation computed on main before ``mechanism`` became a union: ledgers,
    label stores and cap records of existing federations carry on. ``name`` may be given or left out."""
    before = "5122f2515b8bbebaeda1b4fe9d4c823d202a8e816741a55fde5e8e5dd686e403"
    assert FederationConfig.from_dict(federation_dict()).config_hash() == before
    named = {"name": "confident-gnmax", "threshold": 3, "sigma1": 2.0, "sigma2": 1.0}
    assert FederationConfig.from_dict(federation_dict(mechanism=named)).config_hash() == before
    seeded = {"threshold": 3, "sigma1": 2.0, "sigma2": 1.0, "insecure_noise_seed": "x"}
    assert (
        FederationConfig.from_dict(federation_dict(mechanism=seeded)).config_hash()
        == "a191049759dd7a4e3f62a853a0545de4d6875f65ec3eafa1c9f24dfa737e7890"
    )


def test_private_knn_builds_its_mechanism_and_round_trips(tmp_path: Path, federation_dict) -> None:
    from capc_common.federation import batch_costs, mechanism_of, mpc_config
    from capc_common.mechanisms import PrivateKNN

    config = FederationConfig.from_dict(federation_dict(mechanism=KNN, teachers=FOUR_VOTES))
    mechanism = mechanism_of(config)
    assert isinstance(mechanism, PrivateKNN) and not mechanism.trains_heads
    assert (mechanism.neighbours, mechanism.sampling_rate, mechanism.sigma) == (4, 0.25, 3.0)
    costs = batch_costs(config)
    assert costs.query_rdp == 0 and costs.answer_rdp == pytest.approx(float(mechanism.costs([10.0])[1][0]))
    assert mpc_config(config).mode == "gnmax" and mpc_config(config).teachers == 8  # 2 parties × k votes
    config.save(tmp_path / "f.yaml")
    assert FederationConfig.load(tmp_path / "f.yaml").config_hash() == config.config_hash()
    other = FederationConfig.from_dict(
        federation_dict(mechanism={**KNN, "sampling_rate": 0.5}, teachers=FOUR_VOTES)
    )
    assert other.config_hash() != config.config_hash()


@pytest.mark.parametrize(
    ("mechanism", "teachers", "match"),
    [
        ({**KNN, "sampling_rate": 0}, FOUR_VOTES, r"mechanism\.private-knn\.sampling_rate.*greater than 0"),
        ({**KNN, "sampling_rate": 1.5}, FOUR_VOTES, r"sampling_rate.*less than or equal to 1"),
        ({**KNN, "neighbours": 0}, FOUR_VOTES, r"neighbours.*greater than or equal to 1"),
        ({**KNN, "sigma": -1}, FOUR_VOTES, r"sigma.*greater than 0"),
        ({**KNN, "threshold": 3}, FOUR_VOTES, r"threshold.*Extra inputs"),
        ({"name": "private-knn", "sigma": 3.0}, FOUR_VOTES, r"neighbours.*Field required"),
        (KNN, None, r"heads must be 4; \['hospital-a', 'hospital-b'\].*set heads: 4"),
        (
            {"name": "knn", "sigma": 1.0},
            None,
            "mechanism.name must be one of confident-gnmax, gnmax, private-knn",
        ),
    ],
)
def test_bad_private_knn_configs_name_the_field(federation_dict, mechanism, teachers, match: str) -> None:
    change = {"mechanism": mechanism} | ({"teachers": teachers} if teachers else {})
    with pytest.raises(InputError, match=match):
        FederationConfig.from_dict(federation_dict(**change))


def test_a_budget_too_small_for_one_batch_names_the_mechanisms_noise_field(federation_dict) -> None:
    from capc_common.federation import check_batch_fits

    config = FederationConfig.from_dict(
        federation_dict(
            mechanism={"name": "gnmax", "sigma": 0.5}, budget={"epsilon": 1.0, "delta": 1e-5, "order": 10}
        )
    )
    with pytest.raises(InputError, match=r"raise mechanism\.sigma \(now 0\.5\)"):
        check_batch_fits(config)


DPSGD = {
    "name": "secagg-dpsgd",
    "rounds": 5,
    "noise_multiplier": 2.0,
    "clip": 1.0,
    "sampling_rate": 0.1,
    "expected_batch": 100.0,
    "learning_rate": 4.0,
}


@pytest.mark.parametrize(
    "mechanism", [{"name": "dppl", "rho": 0.5}, {"name": "dppl-public", "rho": 0.5}, DPSGD]
)
def test_release_members_round_trip_and_hash_their_parameters(
    tmp_path: Path, federation_dict, mechanism: dict[str, object]
) -> None:
    config = FederationConfig.from_dict(federation_dict(mechanism=mechanism))
    assert config.mechanism.name == mechanism["name"]
    config.save(tmp_path / "f.yaml")
    assert FederationConfig.load(tmp_path / "f.yaml").config_hash() == config.config_hash()
    assert '"insecure_noise_seed"' not in config.canonical_json()  # unset: left out, as for confident-gnmax
    if mechanism["name"] != "dppl-public":  # whole vote counts: no fixed point to set (refused below)
        bits = FederationConfig.from_dict(federation_dict(mechanism={**mechanism, "fixed_point_bits": 12}))
        assert bits.config_hash() != config.config_hash()


def test_the_step_that_follows_the_noise_leaves_running_federations_hashes_alone(federation_dict) -> None:
    """The recipe's newer fields are left out of the canonical form while unset, so a secagg-dpsgd
    federation written before them keeps its config hash (its ledger and cap records name it); set, they
    are parameters like any other."""
    before = FederationConfig.from_dict(federation_dict(mechanism=DPSGD))
    for field in ("step_noise", "unit_variance"):
        assert f'"{field}"' not in before.canonical_json()
    stepped = {**DPSGD, "optimizer": "momentum", "step_noise": 0.004}
    with_step = FederationConfig.from_dict(federation_dict(mechanism=stepped))
    with_unit = FederationConfig.from_dict(federation_dict(mechanism={**stepped, "unit_variance": True}))
    assert len({before.config_hash(), with_step.config_hash(), with_unit.config_hash()}) == 3
    # and they reach the trainer the parties and the student build from federation.yaml
    from capc_common.federation.releases import DPSGDProtocol

    recipe = DPSGDProtocol.of(with_unit.mechanism, classes=10, dim=64).trainer.recipe
    assert (recipe.step_noise, recipe.unit_variance, recipe.optimizer) == (0.004, True, "momentum")
    assert DPSGDProtocol.of(before.mechanism, classes=10, dim=64).trainer.recipe.step_noise is None


@pytest.mark.parametrize(
    ("mechanism", "match"),
    [
        ({"name": "dppl"}, r"mechanism\.dppl\.rho: Field required"),
        ({"name": "dppl", "rho": 0}, r"mechanism\.dppl\.rho: Input should be greater than 0"),
        ({"name": "dppl", "rho": 1, "metric": "manhattan"}, r"mechanism\.dppl\.metric"),
        ({"name": "dppl", "rho": 1, "sigma1": 2}, r"mechanism\.dppl\.sigma1: Extra inputs"),
        ({**DPSGD, "sampling_rate": 1.5}, r"mechanism\.secagg-dpsgd\.sampling_rate"),
        ({**DPSGD, "rounds": 0}, r"mechanism\.secagg-dpsgd\.rounds"),
        (
            {k: v for k, v in DPSGD.items() if k != "expected_batch"} | {"statistics": False},
            "without statistics the noisy gradient sum is normalised by expected_batch",
        ),
        ({**DPSGD, "projection": {"dim": 0}}, r"projection\.dim"),
        ({**DPSGD, "step_noise": 0.004}, r"step_noise sets a heavy-ball step, but optimizer is 'adam'"),
        ({**DPSGD, "optimizer": "momentum", "step_noise": 0}, r"secagg-dpsgd\.step_noise"),
        ({"name": "dppl-public"}, r"mechanism\.dppl-public\.rho: Field required"),
        ({"name": "dppl-public", "rho": 1, "pool_size": 0}, r"mechanism\.dppl-public\.pool_size"),
        (
            {"name": "dppl-public", "rho": 1, "pool_size": 10, "per_class": 11},
            r"per_class 11 is more than the pool's 10 candidates",
        ),
        (
            {"name": "dppl-public", "rho": 1, "fixed_point_bits": 12},
            r"fixed_point_bits does not apply to dppl-public: its contributions are whole vote counts",
        ),
        ({"name": "laplace", "rho": 1}, r"mechanism\.name must be one of confident-gnmax, .*, secagg-dpsgd"),
    ],
)
def test_bad_release_members_name_the_field(
    federation_dict, mechanism: dict[str, object], match: str
) -> None:
    with pytest.raises(InputError, match=match):
        FederationConfig.from_dict(federation_dict(mechanism=mechanism))


def test_release_federations_have_no_batches_and_must_fit_the_budget(federation_dict) -> None:
    from capc_common.federation import mechanism_of
    from capc_common.federation.releases import protocol_for

    config = FederationConfig.from_dict(federation_dict(mechanism=DPSGD))
    with pytest.raises(InputError, match="release mechanism 'secagg-dpsgd', which has no query batches"):
        mechanism_of(config)
    assert protocol_for(config, dim=8).rounds == 6  # the statistics release and 5 gradient rounds
    greedy = FederationConfig.from_dict(federation_dict(mechanism={**DPSGD, "rounds": 100_000}))
    with pytest.raises(InputError, match=r"100001 release\(s\) of RDP .* more than the budget"):
        protocol_for(greedy, dim=8)


def test_a_public_pool_needs_the_backbone_to_featurise_it(federation_dict) -> None:
    """DPPL-Public's protocol featurises its pool: without the shared backbone it is refused by name; with a
    backbone whose features do not have the stated width, too."""
    from capc_common.federation.releases import protocol_for
    from capc_common.models import default_backbone, load_backbone

    config = FederationConfig.from_dict(
        federation_dict(mechanism={"name": "dppl-public", "rho": 0.2, "pool_size": 8, "per_class": 2})
    )
    with pytest.raises(InputError, match="featurises its public candidate pool with the shared backbone"):
        protocol_for(config, dim=16)
    q = config.queries
    backbone = load_backbone(default_backbone(q.height, q.width, q.channels))
    protocol = protocol_for(config, dim=backbone.feature_dim, backbone=backbone)
    assert protocol.rounds == 1 and protocol.length == config.classes * 8
    assert protocol.release_rdp(10.0) == pytest.approx(0.2 * 10.0)  # the ledger charges the configured ρ
    with pytest.raises(InputError, match=r"the pool's features have shape \(8, \d+\), expected \(8, 7\)"):
        protocol_for(config, dim=7, backbone=backbone)


def test_release_fixed_point_must_hold_the_largest_federation(federation_dict) -> None:
    """A fixed point whose total of MAX_RECORDS records could wrap the ring is refused before any party
    starts (a wrap would corrupt the released model silently), and a party above its share is refused."""
    from capc_common.federation.releases import MAX_RECORDS, check_records, protocol_for

    fine = FederationConfig.from_dict(federation_dict(mechanism={"name": "dppl", "rho": 0.2}))
    protocol_for(fine, dim=16)
    wide = FederationConfig.from_dict(
        federation_dict(mechanism={"name": "dppl", "rho": 0.2, "fixed_point_bits": 40})
    )
    with pytest.raises(InputError, match="beyond the signed range of the ring"):
        protocol_for(wide, dim=16)
    check_records(fine, MAX_RECORDS // len(fine.teachers))
    with pytest.raises(InputError, match=r"more parties or lower mechanism\.fixed_point_bits"):
        check_records(fine, MAX_RECORDS // len(fine.teachers) + 1)
    # Whole vote counts have no fixed point to lower: the advice is the class's, not a branch on its name.
    counts = FederationConfig.from_dict(federation_dict(mechanism={"name": "dppl-public", "rho": 0.2}))
    with pytest.raises(InputError, match=r"split the data over more parties$"):
        check_records(counts, MAX_RECORDS // len(counts.teachers) + 1)


PROMPATE = {"name": "prom-pate", "threshold": 3, "sigma1": 2.0, "sigma2": 1.0, "steps": 2, "width": 2}


def test_prom_pate_builds_confident_gnmax_over_prompted_teachers(tmp_path: Path, federation_dict) -> None:
    """Prom-PATE is Confident-GNMax's accounting with the prompt recipe in the hash."""
    from capc_common.federation import batch_costs, mechanism_of, mpc_config
    from capc_common.learn.prompts import PromptRecipe
    from capc_common.mechanisms import ConfidentGNMax, PromPATE

    config = FederationConfig.from_dict(federation_dict(mechanism=PROMPATE))
    mechanism = mechanism_of(config)
    assert isinstance(mechanism, PromPATE) and mechanism.trains_heads
    assert mechanism.recipe == PromptRecipe(steps=2, width=2)
    plain = ConfidentGNMax(
        classes=config.classes, teachers=config.total_heads, threshold=3, sigma1=2, sigma2=1
    )
    orders = [2.0, 10.0, 64.0]
    for ours, theirs in zip(mechanism.costs(orders), plain.costs(orders), strict=True):
        np.testing.assert_array_equal(ours, theirs)
    assert mechanism.params() == plain.params() and mpc_config(config).mode == "confident"
    assert batch_costs(config).answer_rdp == pytest.approx(10.0 / 1.0**2)
    config.save(tmp_path / "f.yaml")
    assert FederationConfig.load(tmp_path / "f.yaml").config_hash() == config.config_hash()
    hashes = {config.config_hash()} | {
        FederationConfig.from_dict(federation_dict(mechanism={**PROMPATE, **change})).config_hash()
        for change in ({"steps": 3}, {"kind": "additive"}, {"prompt_lr": 0.1}, {"map_steps": 20})
    }
    assert len(hashes) == 5


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"kind": "frame"}, r"mechanism\.prom-pate\.kind.*'pad' or 'additive'"),
        ({"steps": -1}, r"steps.*greater than or equal to 0"),
        ({"prompt_lr": 0}, r"prompt_lr.*greater than 0"),
        ({"sigma": 1.0}, r"sigma.*Extra inputs"),
    ],
)
def test_bad_prom_pate_configs_name_the_field(federation_dict, change: dict[str, object], match: str) -> None:
    with pytest.raises(InputError, match=match):
        FederationConfig.from_dict(federation_dict(mechanism={**PROMPATE, **change}))


def test_the_student_precomputes_the_public_basis_for_the_parties_of_its_machine(
    federation_dict, tmp_path: Path
) -> None:
    """secagg-dpsgd's student computes the basis at start (while the parties featurise their records); a party
    sharing its cache reads it from there instead of computing it after them. Other protocols have nothing
    to precompute."""
    from capc_common.federation.releases import protocol_for
    from capc_common.models import default_backbone, load_backbone
    from capc_common.models.cache import FeatureCache

    projected = {**DPSGD, "projection": {"dim": 4, "generators": ["dead_leaves"], "images": 40}}
    config = FederationConfig.from_dict(federation_dict(mechanism=projected))
    q = config.queries
    backbone = load_backbone(default_backbone(q.height, q.width, q.channels))
    student, party = FeatureCache(tmp_path), FeatureCache(tmp_path)
    protocol = protocol_for(config, dim=backbone.feature_dim, backbone=backbone, cache=student)
    protocol.precompute()
    assert (student.computed, student.read) == (1, 0)
    other = protocol_for(config, dim=backbone.feature_dim, backbone=backbone, cache=party)
    assert other.prepare(np.ones((2, backbone.feature_dim))).shape == (2, 4)
    assert (party.computed, party.read) == (0, 1)
    protocol_for(
        FederationConfig.from_dict(federation_dict(mechanism={"name": "dppl", "rho": 0.2})), dim=8
    ).precompute()


NAMES = [f"class-{i}" for i in range(10)]


def test_class_names_are_hashed_when_set_and_absent_otherwise(tmp_path: Path, federation_dict) -> None:
    """A federation without class_names keeps its hash (the pinned one above) and its file has no such key;
    with them, what each index means is a parameter every party shares: another order is another hash."""
    plain = FederationConfig.from_dict(federation_dict())
    named = FederationConfig.from_dict(federation_dict(class_names=NAMES))
    assert "class_names" not in plain.canonical_json() and named.class_names == tuple(NAMES)
    assert named.config_hash() != plain.config_hash()
    swapped = FederationConfig.from_dict(federation_dict(class_names=[NAMES[1], NAMES[0], *NAMES[2:]]))
    assert swapped.config_hash() != named.config_hash()
    plain.save(tmp_path / "plain.yaml")
    named.save(tmp_path / "named.yaml")
    assert "class_names" not in (tmp_path / "plain.yaml").read_text()
    assert FederationConfig.load(tmp_path / "named.yaml") == named


@pytest.mark.parametrize(
    ("names", "says"),
    [
        (NAMES[:3], "class_names lists 3 names but classes is 10"),
        ([*NAMES[:9], NAMES[0]], r"class names must be unique; repeated: \['class-0'\]"),
        ([*NAMES[:9], " x"], "class names must be non-empty, without surrounding spaces; see indices"),
    ],
)
def test_class_names_must_name_every_class_once(federation_dict, names: list[str], says: str) -> None:
    with pytest.raises(InputError, match=says):
        FederationConfig.from_dict(federation_dict(class_names=names))


def test_a_membership_change_keeps_the_class_names(federation_dict) -> None:
    from capc_common.federation import add_party, membership_change

    budget = {"epsilon": 5000.0, "delta": 1e-5, "order": 10}  # pays for a batch
    old = FederationConfig.from_dict(federation_dict(class_names=NAMES, budget=budget))
    grown = add_party(old, name="hospital-c", heads=2)
    assert grown.class_names == old.class_names
    renamed = grown.model_copy(update={"class_names": tuple(reversed(NAMES))})
    with pytest.raises(InputError, match=r"it also changes class_names: \['class-0'"):
        membership_change(old, renamed)


def test_stored_class_names_must_be_the_federations(federation_dict) -> None:
    """A site's .npz imported without the federation's names (sorted folder names, another order) is
    refused before training; indices-only data and a federation without names are not checked."""
    from capc_common.federation.site_data import class_name_problem

    named = FederationConfig.from_dict(federation_dict(class_names=NAMES))
    assert class_name_problem(NAMES, config=named, name="site.npz") == ""
    assert class_name_problem(NAMES[:4], config=named, name="site.npz") == ""  # the first classes only
    assert class_name_problem([str(i) for i in range(10)], config=named, name="site.npz") == ""
    problem = class_name_problem(["class-1", "class-0"], config=named, name="site.npz")
    assert "site.npz names its classes ['class-1', 'class-0']" in problem
    assert "0: 'class-1' here, 'class-0' there; 1: 'class-0' here, 'class-1' there" in problem
    assert "capc data import SOURCE --federation federation.yaml" in problem
    plain = FederationConfig.from_dict(federation_dict())
    assert class_name_problem(["b", "a"], config=plain, name="site.npz") == ""
