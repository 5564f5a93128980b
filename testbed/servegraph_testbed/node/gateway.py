"""A Gateway API implementation on the node: Traefik's kubernetesgateway provider.

KubeRay's incremental upgrade (`NewClusterWithIncrementalUpgrade`) creates a Gateway of the
class the RayService names and an HTTPRoute whose two backends — the old and the new
cluster's serve Services — carry the traffic weights; something has to implement them.
Traefik is installed as users install a Gateway controller: the Gateway API's CRDs (the
standard channel of the version KubeRay builds against), then a Deployment with its
ServiceAccount and RBAC, a Service and a GatewayClass naming Traefik's controller.

- KubeRay's Gateways listen on port 80 (its `DefaultGatewayListenerPort`), and Traefik
  attaches a listener to the entry point whose address ends in that port: the `web` entry
  point is `:80`, bound by a non-root Traefik through the pod's
  `net.ipv4.ip_unprivileged_port_start` sysctl (a safe sysctl; the kubelet allows it).
- Traefik writes the Service's fixed ClusterIP into each Gateway's `status.addresses`
  (`statusAddress.ip`): a client finds the Gateway's address there, as it would a cloud
  load balancer's.
- A `websecure` entry point on :443 takes the HTTPS listeners of an administrator's Gateway
  (TLS terminated there, its certificate from a Secret: `spec.expose`'s front door), and the
  Service is a NodePort one: from outside the pod network a client reaches Traefik at the
  node's address, port HTTPS_NODE_PORT (HTTP_NODE_PORT for :80), as it would a load balancer.
- Nothing leaves the machine: no version check, no anonymous usage report.
"""

from __future__ import annotations

from servegraph_testbed.node.cluster import NodeCluster

NAMESPACE = "traefik"
DEPLOYMENT = "traefik"
GATEWAY_CLASS = "traefik"
PUBLIC_GATEWAY = "public"
"""The administrator's Gateway in NAMESPACE the operator allows spec.expose to name (node/install.py);
a test makes it, with the listeners and certificate it needs."""
CONTROLLER_NAME = "traefik.io/gateway-controller"  # Traefik's own (kubernetesgateway provider)
HTTP_PORT = 80  # KubeRay's Gateway listener port
HTTPS_PORT = 443
HTTP_NODE_PORT, HTTPS_NODE_PORT = 30080, 30443


def traefik_manifests(image: str, service_ip: str) -> str:
    """Traefik's namespace, RBAC, Deployment, Service and GatewayClass."""
    return f"""
apiVersion: v1
kind: Namespace
metadata: {{name: {NAMESPACE}}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: traefik, namespace: {NAMESPACE}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: traefik-gateway}}
rules:
  - apiGroups: [""]
    resources: [namespaces, services, secrets, configmaps]
    verbs: [get, list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [list, watch]
  - apiGroups: [gateway.networking.k8s.io]
    resources: [gatewayclasses, gateways, httproutes, grpcroutes, referencegrants, backendtlspolicies]
    verbs: [get, list, watch]
  - apiGroups: [gateway.networking.k8s.io]
    resources: [gatewayclasses/status, gateways/status, httproutes/status, grpcroutes/status, backendtlspolicies/status]
    verbs: [update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: traefik-gateway}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: traefik-gateway}}
subjects: [{{kind: ServiceAccount, name: traefik, namespace: {NAMESPACE}}}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {DEPLOYMENT}, namespace: {NAMESPACE}, labels: {{app: traefik}}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: traefik}}}}
  template:
    metadata: {{labels: {{app: traefik}}}}
    spec:
      serviceAccountName: traefik
      securityContext:
        runAsNonRoot: true
        sysctls: [{{name: net.ipv4.ip_unprivileged_port_start, value: "0"}}]
      containers:
        - name: traefik
          image: {image}
          imagePullPolicy: Never
          args:
            - --entryPoints.web.address=:{HTTP_PORT}
            - --entryPoints.websecure.address=:{HTTPS_PORT}
            - --entryPoints.traefik.address=:8080
            - --ping=true
            - --providers.kubernetesgateway=true
            - --providers.kubernetesgateway.statusAddress.ip={service_ip}
            - --global.checkNewVersion=false
            - --global.sendAnonymousUsage=false
            - --log.level=INFO
          ports:
            - {{name: web, containerPort: {HTTP_PORT}}}
            - {{name: websecure, containerPort: {HTTPS_PORT}}}
            - {{name: traefik, containerPort: 8080}}
          resources:
            requests: {{cpu: 50m, memory: 64Mi}}
            limits: {{memory: 256Mi}}
          readinessProbe:
            httpGet: {{path: /ping, port: 8080}}
            periodSeconds: 2
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities: {{drop: [ALL]}}
---
apiVersion: v1
kind: Service
metadata: {{name: traefik, namespace: {NAMESPACE}}}
spec:
  type: NodePort
  selector: {{app: traefik}}
  clusterIP: {service_ip}
  ports:
    - {{name: web, port: {HTTP_PORT}, targetPort: web, nodePort: {HTTP_NODE_PORT}}}
    - {{name: websecure, port: {HTTPS_PORT}, targetPort: websecure, nodePort: {HTTPS_NODE_PORT}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: {GATEWAY_CLASS}}}
spec: {{controllerName: {CONTROLLER_NAME}}}
"""


def install_gateway(cluster: NodeCluster) -> None:
    """The Gateway API's CRDs, then Traefik; returns once its GatewayClass is Accepted."""
    cp = cluster.cp
    assert cluster.net is not None
    crds = sorted(cp.binaries.gateway_crds.glob("gateway.networking.k8s.io_*.yaml"))
    cp.kubectl("apply", "--server-side", "-f", str(cp.binaries.gateway_crds))
    # gateway.networking.k8s.io_httproutes.yaml defines httproutes.gateway.networking.k8s.io
    names = [f"crd/{f.stem.partition('_')[2]}.gateway.networking.k8s.io" for f in crds]
    cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", *names)
    cp.kubectl("apply", "-f", "-", stdin=traefik_manifests(cluster.images.ref("traefik"), cluster.net.gateway_ip))
    cluster.wait_rollout(NAMESPACE, f"deployment/{DEPLOYMENT}")
    cp.kubectl("wait", "--for=condition=Accepted", "--timeout=60s", f"gatewayclass/{GATEWAY_CLASS}")
