from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Graph(_message.Message):
    __slots__ = ("name", "version", "schema_version", "applications", "cluster", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    APPLICATIONS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    schema_version: int
    applications: _containers.RepeatedCompositeFieldContainer[Application]
    cluster: ClusterHints
    labels: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., schema_version: _Optional[int] = ..., applications: _Optional[_Iterable[_Union[Application, _Mapping]]] = ..., cluster: _Optional[_Union[ClusterHints, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ClusterHints(_message.Message):
    __slots__ = ("ray_version", "image", "worker_groups")
    RAY_VERSION_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    WORKER_GROUPS_FIELD_NUMBER: _ClassVar[int]
    ray_version: str
    image: str
    worker_groups: _containers.RepeatedCompositeFieldContainer[WorkerGroupHint]
    def __init__(self, ray_version: _Optional[str] = ..., image: _Optional[str] = ..., worker_groups: _Optional[_Iterable[_Union[WorkerGroupHint, _Mapping]]] = ...) -> None: ...

class WorkerGroupHint(_message.Message):
    __slots__ = ("name", "gpu", "accelerator_type", "cpus_per_worker", "gpus_per_worker", "memory_bytes_per_worker", "max_workers", "node_selector", "tolerations", "node_affinity", "priority_class_name")
    class NodeSelectorEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_TYPE_FIELD_NUMBER: _ClassVar[int]
    CPUS_PER_WORKER_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_WORKER_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_PER_WORKER_FIELD_NUMBER: _ClassVar[int]
    MAX_WORKERS_FIELD_NUMBER: _ClassVar[int]
    NODE_SELECTOR_FIELD_NUMBER: _ClassVar[int]
    TOLERATIONS_FIELD_NUMBER: _ClassVar[int]
    NODE_AFFINITY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_CLASS_NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    gpu: bool
    accelerator_type: str
    cpus_per_worker: float
    gpus_per_worker: int
    memory_bytes_per_worker: int
    max_workers: int
    node_selector: _containers.ScalarMap[str, str]
    tolerations: _containers.RepeatedCompositeFieldContainer[Toleration]
    node_affinity: NodeAffinity
    priority_class_name: str
    def __init__(self, name: _Optional[str] = ..., gpu: _Optional[bool] = ..., accelerator_type: _Optional[str] = ..., cpus_per_worker: _Optional[float] = ..., gpus_per_worker: _Optional[int] = ..., memory_bytes_per_worker: _Optional[int] = ..., max_workers: _Optional[int] = ..., node_selector: _Optional[_Mapping[str, str]] = ..., tolerations: _Optional[_Iterable[_Union[Toleration, _Mapping]]] = ..., node_affinity: _Optional[_Union[NodeAffinity, _Mapping]] = ..., priority_class_name: _Optional[str] = ...) -> None: ...

class Toleration(_message.Message):
    __slots__ = ("key", "operator", "value", "effect", "toleration_seconds")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    TOLERATION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    key: str
    operator: str
    value: str
    effect: str
    toleration_seconds: int
    def __init__(self, key: _Optional[str] = ..., operator: _Optional[str] = ..., value: _Optional[str] = ..., effect: _Optional[str] = ..., toleration_seconds: _Optional[int] = ...) -> None: ...

class NodeAffinity(_message.Message):
    __slots__ = ("required", "preferred")
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_FIELD_NUMBER: _ClassVar[int]
    required: _containers.RepeatedCompositeFieldContainer[NodeSelectorTerm]
    preferred: _containers.RepeatedCompositeFieldContainer[WeightedNodeSelectorTerm]
    def __init__(self, required: _Optional[_Iterable[_Union[NodeSelectorTerm, _Mapping]]] = ..., preferred: _Optional[_Iterable[_Union[WeightedNodeSelectorTerm, _Mapping]]] = ...) -> None: ...

class NodeSelectorTerm(_message.Message):
    __slots__ = ("match_expressions",)
    MATCH_EXPRESSIONS_FIELD_NUMBER: _ClassVar[int]
    match_expressions: _containers.RepeatedCompositeFieldContainer[NodeSelectorRequirement]
    def __init__(self, match_expressions: _Optional[_Iterable[_Union[NodeSelectorRequirement, _Mapping]]] = ...) -> None: ...

class NodeSelectorRequirement(_message.Message):
    __slots__ = ("key", "operator", "values")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    key: str
    operator: str
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, key: _Optional[str] = ..., operator: _Optional[str] = ..., values: _Optional[_Iterable[str]] = ...) -> None: ...

class WeightedNodeSelectorTerm(_message.Message):
    __slots__ = ("weight", "term")
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    weight: int
    term: NodeSelectorTerm
    def __init__(self, weight: _Optional[int] = ..., term: _Optional[_Union[NodeSelectorTerm, _Mapping]] = ...) -> None: ...

class Application(_message.Message):
    __slots__ = ("name", "route_prefix", "ingress", "runtime_env", "nodes", "telemetry", "grpc_servicer_functions")
    class NodesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Node
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Node, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROUTE_PREFIX_FIELD_NUMBER: _ClassVar[int]
    INGRESS_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_ENV_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    GRPC_SERVICER_FUNCTIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    route_prefix: str
    ingress: str
    runtime_env: RuntimeEnv
    nodes: _containers.MessageMap[str, Node]
    telemetry: Telemetry
    grpc_servicer_functions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., route_prefix: _Optional[str] = ..., ingress: _Optional[str] = ..., runtime_env: _Optional[_Union[RuntimeEnv, _Mapping]] = ..., nodes: _Optional[_Mapping[str, Node]] = ..., telemetry: _Optional[_Union[Telemetry, _Mapping]] = ..., grpc_servicer_functions: _Optional[_Iterable[str]] = ...) -> None: ...

class Telemetry(_message.Message):
    __slots__ = ("forward_headers", "disable_metrics")
    FORWARD_HEADERS_FIELD_NUMBER: _ClassVar[int]
    DISABLE_METRICS_FIELD_NUMBER: _ClassVar[int]
    forward_headers: _containers.RepeatedScalarFieldContainer[str]
    disable_metrics: bool
    def __init__(self, forward_headers: _Optional[_Iterable[str]] = ..., disable_metrics: _Optional[bool] = ...) -> None: ...

class RuntimeEnv(_message.Message):
    __slots__ = ("pip", "env_vars", "working_dir", "py_modules")
    class EnvVarsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PIP_FIELD_NUMBER: _ClassVar[int]
    ENV_VARS_FIELD_NUMBER: _ClassVar[int]
    WORKING_DIR_FIELD_NUMBER: _ClassVar[int]
    PY_MODULES_FIELD_NUMBER: _ClassVar[int]
    pip: _containers.RepeatedScalarFieldContainer[str]
    env_vars: _containers.ScalarMap[str, str]
    working_dir: str
    py_modules: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, pip: _Optional[_Iterable[str]] = ..., env_vars: _Optional[_Mapping[str, str]] = ..., working_dir: _Optional[str] = ..., py_modules: _Optional[_Iterable[str]] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("deployment", "sequence", "ensemble", "switch", "splitter", "resources", "scaling", "max_ongoing_requests", "max_queued_requests", "user_config", "health_check_period_s", "health_check_timeout_s", "graceful_shutdown_wait_loop_s", "graceful_shutdown_timeout_s", "max_replicas_per_node")
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    ENSEMBLE_FIELD_NUMBER: _ClassVar[int]
    SWITCH_FIELD_NUMBER: _ClassVar[int]
    SPLITTER_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    SCALING_FIELD_NUMBER: _ClassVar[int]
    MAX_ONGOING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    USER_CONFIG_FIELD_NUMBER: _ClassVar[int]
    HEALTH_CHECK_PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    HEALTH_CHECK_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    GRACEFUL_SHUTDOWN_WAIT_LOOP_S_FIELD_NUMBER: _ClassVar[int]
    GRACEFUL_SHUTDOWN_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    MAX_REPLICAS_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    deployment: Deployment
    sequence: Sequence
    ensemble: Ensemble
    switch: Switch
    splitter: Splitter
    resources: Resources
    scaling: Scaling
    max_ongoing_requests: int
    max_queued_requests: int
    user_config: _struct_pb2.Struct
    health_check_period_s: float
    health_check_timeout_s: float
    graceful_shutdown_wait_loop_s: float
    graceful_shutdown_timeout_s: float
    max_replicas_per_node: int
    def __init__(self, deployment: _Optional[_Union[Deployment, _Mapping]] = ..., sequence: _Optional[_Union[Sequence, _Mapping]] = ..., ensemble: _Optional[_Union[Ensemble, _Mapping]] = ..., switch: _Optional[_Union[Switch, _Mapping]] = ..., splitter: _Optional[_Union[Splitter, _Mapping]] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., scaling: _Optional[_Union[Scaling, _Mapping]] = ..., max_ongoing_requests: _Optional[int] = ..., max_queued_requests: _Optional[int] = ..., user_config: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., health_check_period_s: _Optional[float] = ..., health_check_timeout_s: _Optional[float] = ..., graceful_shutdown_wait_loop_s: _Optional[float] = ..., graceful_shutdown_timeout_s: _Optional[float] = ..., max_replicas_per_node: _Optional[int] = ...) -> None: ...

class Deployment(_message.Message):
    __slots__ = ("import_path", "args", "kwargs", "streaming")
    class KwargsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Argument
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Argument, _Mapping]] = ...) -> None: ...
    IMPORT_PATH_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    KWARGS_FIELD_NUMBER: _ClassVar[int]
    STREAMING_FIELD_NUMBER: _ClassVar[int]
    import_path: str
    args: _containers.RepeatedCompositeFieldContainer[Argument]
    kwargs: _containers.MessageMap[str, Argument]
    streaming: bool
    def __init__(self, import_path: _Optional[str] = ..., args: _Optional[_Iterable[_Union[Argument, _Mapping]]] = ..., kwargs: _Optional[_Mapping[str, Argument]] = ..., streaming: _Optional[bool] = ...) -> None: ...

class Argument(_message.Message):
    __slots__ = ("value", "node")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    value: _struct_pb2.Value
    node: NodeRef
    def __init__(self, value: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., node: _Optional[_Union[NodeRef, _Mapping]] = ...) -> None: ...

class NodeRef(_message.Message):
    __slots__ = ("id", "timeout_s", "retries", "optional")
    ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    OPTIONAL_FIELD_NUMBER: _ClassVar[int]
    id: str
    timeout_s: float
    retries: int
    optional: bool
    def __init__(self, id: _Optional[str] = ..., timeout_s: _Optional[float] = ..., retries: _Optional[int] = ..., optional: _Optional[bool] = ...) -> None: ...

class Sequence(_message.Message):
    __slots__ = ("steps",)
    STEPS_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[NodeRef]
    def __init__(self, steps: _Optional[_Iterable[_Union[NodeRef, _Mapping]]] = ...) -> None: ...

class Ensemble(_message.Message):
    __slots__ = ("members", "combiner")
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    COMBINER_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[NodeRef]
    combiner: NodeRef
    def __init__(self, members: _Optional[_Iterable[_Union[NodeRef, _Mapping]]] = ..., combiner: _Optional[_Union[NodeRef, _Mapping]] = ...) -> None: ...

class Switch(_message.Message):
    __slots__ = ("field", "header", "cases", "default")
    FIELD_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CASES_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_FIELD_NUMBER: _ClassVar[int]
    field: str
    header: str
    cases: _containers.RepeatedCompositeFieldContainer[SwitchCase]
    default: NodeRef
    def __init__(self, field: _Optional[str] = ..., header: _Optional[str] = ..., cases: _Optional[_Iterable[_Union[SwitchCase, _Mapping]]] = ..., default: _Optional[_Union[NodeRef, _Mapping]] = ...) -> None: ...

class SwitchCase(_message.Message):
    __slots__ = ("equals", "node")
    EQUALS_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    equals: str
    node: NodeRef
    def __init__(self, equals: _Optional[str] = ..., node: _Optional[_Union[NodeRef, _Mapping]] = ...) -> None: ...

class Splitter(_message.Message):
    __slots__ = ("routes",)
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    routes: _containers.RepeatedCompositeFieldContainer[WeightedRoute]
    def __init__(self, routes: _Optional[_Iterable[_Union[WeightedRoute, _Mapping]]] = ...) -> None: ...

class WeightedRoute(_message.Message):
    __slots__ = ("node", "weight")
    NODE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    node: NodeRef
    weight: int
    def __init__(self, node: _Optional[_Union[NodeRef, _Mapping]] = ..., weight: _Optional[int] = ...) -> None: ...

class Resources(_message.Message):
    __slots__ = ("num_cpus", "num_gpus", "memory_bytes", "custom", "accelerator_type")
    class CustomEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NUM_CPUS_FIELD_NUMBER: _ClassVar[int]
    NUM_GPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_TYPE_FIELD_NUMBER: _ClassVar[int]
    num_cpus: float
    num_gpus: float
    memory_bytes: int
    custom: _containers.ScalarMap[str, float]
    accelerator_type: str
    def __init__(self, num_cpus: _Optional[float] = ..., num_gpus: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., custom: _Optional[_Mapping[str, float]] = ..., accelerator_type: _Optional[str] = ...) -> None: ...

class Scaling(_message.Message):
    __slots__ = ("num_replicas", "autoscaling")
    NUM_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    AUTOSCALING_FIELD_NUMBER: _ClassVar[int]
    num_replicas: int
    autoscaling: Autoscaling
    def __init__(self, num_replicas: _Optional[int] = ..., autoscaling: _Optional[_Union[Autoscaling, _Mapping]] = ...) -> None: ...

class Autoscaling(_message.Message):
    __slots__ = ("min_replicas", "max_replicas", "initial_replicas", "target_ongoing_requests", "upscale_delay_s", "downscale_delay_s")
    MIN_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    MAX_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    INITIAL_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TARGET_ONGOING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    UPSCALE_DELAY_S_FIELD_NUMBER: _ClassVar[int]
    DOWNSCALE_DELAY_S_FIELD_NUMBER: _ClassVar[int]
    min_replicas: int
    max_replicas: int
    initial_replicas: int
    target_ongoing_requests: float
    upscale_delay_s: float
    downscale_delay_s: float
    def __init__(self, min_replicas: _Optional[int] = ..., max_replicas: _Optional[int] = ..., initial_replicas: _Optional[int] = ..., target_ongoing_requests: _Optional[float] = ..., upscale_delay_s: _Optional[float] = ..., downscale_delay_s: _Optional[float] = ...) -> None: ...
