"""The methods of ``benchmarks/mechanisms.py``, one module per family, each a :class:`~methods.common.Method`
(name, runner, the ``HYPER`` groups it reads, what it needs besides the parties):

* :mod:`~methods.heads` — ``local-only``;
* :mod:`~methods.dpsgd` — ``secagg-dpsgd``, ``central-dpsgd``;
* :mod:`~methods.prototypes` — ``dppl``, ``dppl-public``, ``dppl-public-votes``;
* :mod:`~methods.votes` — ``private-knn``;
* :mod:`~methods.capc` — ``capc-fair``, ``capc-greedy``;
* :mod:`~methods.cnn` — ``cnn-dpsgd``;
* :mod:`~methods.fedavg` — ``dp-fedavg``;
* :mod:`~methods.prompate` — ``prom-pate``.

:mod:`~methods.data` loads what every method sees; :mod:`~methods.common` holds δ, the orders and ``HYPER``.
"""

from methods.capc import CAPC_FAIR, CAPC_GREEDY
from methods.cnn import CNN_DPSGD
from methods.common import Method
from methods.dpsgd import CENTRAL_DPSGD, SECAGG_DPSGD
from methods.fedavg import DP_FEDAVG
from methods.heads import LOCAL_ONLY
from methods.prompate import PROM_PATE
from methods.prototypes import DPPL, DPPL_PUBLIC, DPPL_PUBLIC_VOTES
from methods.votes import PRIVATE_KNN

#: Every method, in the order of the table's rows.
REGISTRY: tuple[Method, ...] = (
    LOCAL_ONLY,
    SECAGG_DPSGD,
    CENTRAL_DPSGD,
    DPPL,
    DPPL_PUBLIC,
    DPPL_PUBLIC_VOTES,
    PRIVATE_KNN,
    CAPC_FAIR,
    CAPC_GREEDY,
    CNN_DPSGD,
    DP_FEDAVG,
    PROM_PATE,
)
