"""Pinned guarantee values: the numbers every mechanism's guarantee and calibration gave BEFORE the accounting moved
to one accountant path (issue 11), computed by the pre-refactor code (commit e6040b6) and stored here, so that any
change to a formula, a composition or a conversion shows as a failure.

Keys: ``"<mechanism> <T_max> <parameters…>"`` (see :func:`_build`); calibrated knobs: ``"<mechanism> <ε> <T_max>"``.
Compared to 1e-12 relative (the refactor reproduced them bit for bit on the machine that made it).
"""

from __future__ import annotations

import pytest

from dpinfer.accounting.calibration import Budget, Spec
from dpinfer.mechanisms.amin import AminSVT
from dpinfer.mechanisms.dp_decoding import DPDecoding
from dpinfer.mechanisms.dp_fusion import DPFusion, calibrate_bound
from dpinfer.mechanisms.dp_prompt import DPPrompt
from dpinfer.mechanisms.invisibleink import InvisibleInk

REL = 1e-12

EPSILON = {
    'amin 1 0.1 False False': 0.09857501187789558,
    'amin 1 0.1 False True': 0.04709554318397702,
    'amin 1 0.1 True False': 1.6050804163405918,
    'amin 1 0.1 True True': 0.7528445020033734,
    'amin 1 0.604 False False': 0.6666887160026865,
    'amin 1 0.604 False True': 0.3189495084557761,
    'amin 1 0.604 True False': 14.246889757215598,
    'amin 1 0.604 True True': 5.753527245092609,
    'amin 1 3.0 False False': 3.7817374257707694,
    'amin 1 3.0 False True': 1.7692545241440136,
    'amin 1 3.0 True False': 157.25558359009926,
    'amin 1 3.0 True True': 65.34265392299018,
    'amin 256 0.1 False False': 1.8974595524818954,
    'amin 256 0.1 False True': 0.8999353561108617,
    'amin 256 0.1 True False': 22.77023093443392,
    'amin 256 0.1 True True': 9.581825163225954,
    'amin 256 0.604 False False': 14.697989285142226,
    'amin 256 0.604 False True': 6.475249936156041,
    'amin 256 0.604 True False': 398.5631353109019,
    'amin 256 0.604 True True': 114.6380086028459,
    'amin 256 3.0 False False': 133.05526372713751,
    'amin 256 3.0 False True': 48.05174194866685,
    'amin 256 3.0 True False': 9614.738376468955,
    'amin 256 3.0 True True': 3167.936639578112,
    'dec 1 0.0 1': 0.0,
    'dec 1 0.0 3': 0.0,
    'dec 1 0.01 1': 6.209565100828038,
    'dec 1 0.01 3': 18.628695302484115,
    'dec 1 0.5 1': 10.80269316135247,
    'dec 1 0.5 3': 32.40807948405741,
    'dec 1 1e-06 1': 0.047982265671164724,
    'dec 1 1e-06 3': 0.14394679701349417,
    'dec 256 0.0 1': 0.0,
    'dec 256 0.0 3': 0.0,
    'dec 256 0.01 1': 1589.6486658119777,
    'dec 256 0.01 3': 4768.945997435933,
    'dec 256 0.5 1': 2765.4894493062325,
    'dec 256 0.5 3': 8296.468347918697,
    'dec 256 1e-06 1': 3.499060627583271,
    'dec 256 1e-06 3': 6.582285198454002,
    'fusion 1 replace-by-null as_published 1.5': 21.916308425056016,
    'fusion 1 replace-by-null as_published 2.0': 10.726631103850337,
    'fusion 1 replace-by-null as_published 8.0': 1.3641091678455335,
    'fusion 1 replace-by-null dpinfer 1.5': 21.221388479237113,
    'fusion 1 replace-by-null dpinfer 2.0': 10.236937013138757,
    'fusion 1 replace-by-null dpinfer 8.0': 1.388459631277603,
    'fusion 1 replace-one dpinfer 1.5': 21.463269261366918,
    'fusion 1 replace-one dpinfer 2.0': 10.443143562005137,
    'fusion 1 replace-one dpinfer 8.0': 1.6822339949440852,
    'fusion 256 replace-by-null as_published 1.5': 225.916308425056,
    'fusion 256 replace-by-null as_published 2.0': 163.72663110385034,
    'fusion 256 replace-by-null as_published 8.0': 39.614109167845534,
    'fusion 256 replace-by-null dpinfer 1.5': 48.016802295416696,
    'fusion 256 replace-by-null dpinfer 2.0': 38.36494388168536,
    'fusion 256 replace-by-null dpinfer 8.0': 45.847827806455335,
    'fusion 256 replace-one dpinfer 1.5': 109.93828252064671,
    'fusion 256 replace-one dpinfer 2.0': 91.15382039147883,
    'fusion 256 replace-one dpinfer 8.0': 121.05406490507478,
    'ink 1 0.1': 0.049057298991490875,
    'ink 1 0.604': 0.332165877747417,
    'ink 1 3.0': 1.8440190775735248,
    'ink 256 0.1': 0.9374969899474912,
    'ink 256 0.604': 6.765642524144241,
    'ink 256 3.0': 50.6827453771149,
    'prompt 1 0.5': 36.0,
    'prompt 1 1.0': 18.0,
    'prompt 1 7.3': 2.4657534246575343,
    'prompt 256 0.5': 9216.0,
    'prompt 256 1.0': 4608.0,
    'prompt 256 7.3': 161.9831495908684,
}

GROUP_EPSILONS = {
    'fusion 1 replace-by-null as_published 1.5': [21.142975091722683, 21.24964175838935, 21.916308425056016],
    'fusion 1 replace-by-null as_published 2.0': [10.146631103850337, 10.226631103850337, 10.726631103850337],
    'fusion 1 replace-by-null as_published 8.0': [1.2191091678455335, 1.2391091678455335, 1.3641091678455335],
    'fusion 1 replace-by-null dpinfer 1.5': [21.11964731702746, 21.13311436398272, 21.221388479237113],
    'fusion 1 replace-by-null dpinfer 2.0': [10.129975560609495, 10.143577071894347, 10.236937013138757],
    'fusion 1 replace-by-null dpinfer 8.0': [1.2175208730629192, 1.2327885362200193, 1.388459631277603],
    'fusion 1 replace-one dpinfer 1.5': [21.12635850807529, 21.167568641557995, 21.463269261366918],
    'fusion 1 replace-one dpinfer 2.0': [10.13503407331369, 10.170057209708878, 10.443143562005137],
    'fusion 1 replace-one dpinfer 8.0': [1.2213528324661984, 1.257499925284663, 1.6822339949440852],
    'fusion 256 replace-by-null as_published 1.5': [27.942975091722683, 55.24964175838935, 225.916308425056],
    'fusion 256 replace-by-null as_published 2.0': [15.246631103850337, 35.72663110385034, 163.72663110385034],
    'fusion 256 replace-by-null as_published 8.0': [2.494109167845534, 7.614109167845534, 39.614109167845534],
    'fusion 256 replace-by-null dpinfer 1.5': [21.97106476974573, 25.41862879029261, 48.016802295416696],
    'fusion 256 replace-by-null dpinfer 2.0': [10.982812034194392, 14.46479892311649, 38.36494388168536],
    'fusion 256 replace-by-null dpinfer 8.0': [2.0875057034962916, 5.996027471713919, 45.847827806455335],
    'fusion 256 replace-one dpinfer 1.5': [23.689129677989825, 34.23892384956286, 109.93828252064671],
    'fusion 256 replace-one dpinfer 2.0': [12.277791286468632, 21.243714203636497, 91.15382039147883],
    'fusion 256 replace-one dpinfer 8.0': [3.068487310735769, 12.3221430722627, 121.05406490507478],
}

CALIBRATED = {
    'amin 1.0 256': 0.006591788947844179,
    'amin 1.0 50': 0.00931588202365674,
    'amin 10.0 256': 0.051815656799590215,
    'amin 10.0 50': 0.0728933823411353,
    'amin 50.0 256': 0.17669175122864544,
    'amin 50.0 50': 0.2455616646911949,
    'dec 1.0 256': 3.167855038942745e-07,
    'dec 1.0 50': 7.238598491126156e-07,
    'dec 10.0 256': 2.5483989557947407e-06,
    'dec 10.0 50': 6.2272711343358945e-06,
    'dec 50.0 256': 1.0076370512650647e-05,
    'dec 50.0 50': 3.4957311237515745e-05,
    'fusion 11.0 256': 0.010200072050793096,
    'fusion 11.0 50': 0.051512620731955394,
    'fusion 15.0 256': 0.056055938301142305,
    'fusion 15.0 50': 0.26783116860315204,
    'fusion 40.0 256': 0.3157756894361228,
    'fusion 40.0 50': 1.2391072092577815,
    'fusion8 11.0 256': 0.03299794625490904,
    'fusion8 11.0 50': 0.13291686272714287,
    'fusion8 15.0 256': 0.04483281329157762,
    'fusion8 15.0 50': 0.17571251385379583,
    'fusion8 40.0 256': 0.10783367144176736,
    'fusion8 40.0 50': 0.42213641363196075,
    'ink 1.0 256': 0.10621423017947423,
    'ink 1.0 50': 0.24033536773892827,
    'ink 10.0 256': 0.84437497432223,
    'ink 10.0 50': 1.9106024646638906,
    'ink 50.0 256': 2.9710203935965724,
    'ink 50.0 50': 6.722651735538118,
    'prompt 1.0 256': 915.3090488910675,
    'prompt 1.0 50': 404.5132719911635,
    'prompt 10.0 256': 119.83496713638306,
    'prompt 10.0 50': 52.96007366850972,
    'prompt 50.0 256': 35.15210304260254,
    'prompt 50.0 50': 15.535181518644094,
}


def _build(key: str):
    kind, t, *rest = key.split()
    if kind == "fusion":
        adj, acc, alpha = rest
        mech = DPFusion(bounds=[0.01, 0.05, 0.3], group_names=["A", "B", "C"], alpha=float(alpha), accounting=acc,
                        adjacency=adj)
    elif kind == "dec":
        mech = DPDecoding(float(rest[0]), vocab_size=49152, num_sequences=int(rest[1]))
    elif kind == "prompt":
        mech = DPPrompt(-1.0, 3.5, float(rest[0]), num_rewrites=2)
    elif kind == "ink":
        mech = InvisibleInk(clip_norm=float(rest[0]), batch_size=7, temperature=1.1)
    else:
        mech = AminSVT(clip_norm=float(rest[0]), batch_size=8, svt=rest[1] == "True", as_published=rest[2] == "True")
    return mech, int(t)


@pytest.mark.parametrize("key", sorted(EPSILON))
def test_guarantee_epsilon_is_pinned(key: str) -> None:
    mech, t = _build(key)
    g = mech.guarantee(t)
    assert g.epsilon == pytest.approx(EPSILON[key], rel=REL)
    if key in GROUP_EPSILONS:
        assert [x.epsilon for x in g.groups] == pytest.approx(GROUP_EPSILONS[key], rel=REL)


@pytest.mark.parametrize("key", sorted(CALIBRATED))
def test_calibrated_knob_is_pinned(key: str) -> None:
    kind, eps, t = key.split()
    eps, t = float(eps), int(t)
    if kind == "fusion":
        got = calibrate_bound(eps, num_groups=3, max_new_tokens=t)
    elif kind == "fusion8":
        got = calibrate_bound(eps, num_groups=2, max_new_tokens=t, alpha=8.0, adjacency="replace-one")
    elif kind == "dec":
        got = DPDecoding.calibrated(Budget(eps, 1e-5), Spec(t, vocab_size=49152)).lam
    elif kind == "prompt":
        got = DPPrompt.calibrated(Budget(eps, 1e-5), Spec(t, clip_min=0.0, clip_max=10.0, num_rewrites=2)).temperature
    elif kind == "ink":
        got = InvisibleInk.calibrated(Budget(eps, 1e-6), Spec(t, batch_size=7, temperature=1.1)).clip_norm
    else:
        got = AminSVT.calibrated(Budget(eps, 1e-6), Spec(t, batch_size=8)).clip_norm
    assert got == pytest.approx(CALIBRATED[key], rel=REL)
