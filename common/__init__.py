"""streamwal: a write-ahead log of physical channels, after Milvus's streaming service.

The parts live in top-level folders of the repository, mapped into this namespace:
`streamwal.node` (streaming node), `streamwal.coord` (assignment brain),
`streamwal.client` (the API users import), `streamwal.operator` (Kubernetes adapter),
`streamwal.spark` (PySpark data source), `streamwal.proto` (the wire contract).
"""

__version__ = "0.1.0"
