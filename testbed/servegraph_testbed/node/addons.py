"""Cluster add-ons of the node tier: CoreDNS as the cluster DNS (kube-dns Service)."""

from __future__ import annotations

from servegraph_testbed.node.configs import CLUSTER_DOMAIN


def coredns_manifests(image: str, dns_ip: str) -> str:
    """CoreDNS serving cluster.local from the API server, as kubeadm installs it, trimmed.

    It listens on 1053 as a non-root user; the kube-dns Service maps port 53 to it. There
    is no `forward`: this machine has no upstream resolver, and nothing may leave it.
    """
    return f"""
apiVersion: v1
kind: ServiceAccount
metadata: {{name: coredns, namespace: kube-system}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: "system:coredns"}}
rules:
  - apiGroups: [""]
    resources: [endpoints, services, pods, namespaces]
    verbs: [list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: "system:coredns"}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}}
subjects: [{{kind: ServiceAccount, name: coredns, namespace: kube-system}}]
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: coredns, namespace: kube-system}}
data:
  Corefile: |
    .:1053 {{
        errors
        health :8080
        ready :8181
        kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
            ttl 30
        }}
        cache 30
        loop
        reload
        loadbalance
    }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels: {{k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {{matchLabels: {{k8s-app: kube-dns}}}}
  template:
    metadata: {{labels: {{k8s-app: kube-dns}}}}
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      dnsPolicy: Default
      containers:
        - name: coredns
          image: {image}
          imagePullPolicy: Never
          args: [-conf, /etc/coredns/Corefile]
          ports:
            - {{name: dns, containerPort: 1053, protocol: UDP}}
            - {{name: dns-tcp, containerPort: 1053, protocol: TCP}}
          resources:
            requests: {{cpu: 50m, memory: 70Mi}}
            limits: {{memory: 170Mi}}
          readinessProbe:
            httpGet: {{path: /ready, port: 8181}}
            periodSeconds: 2
          livenessProbe:
            httpGet: {{path: /health, port: 8080}}
            periodSeconds: 10
          securityContext:
            runAsNonRoot: true
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities: {{drop: [ALL]}}
          volumeMounts: [{{name: config, mountPath: /etc/coredns, readOnly: true}}]
      volumes: [{{name: config, configMap: {{name: coredns}}}}]
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {{k8s-app: kube-dns}}
spec:
  selector: {{k8s-app: kube-dns}}
  clusterIP: {dns_ip}
  ports:
    - {{name: dns, port: 53, targetPort: 1053, protocol: UDP}}
    - {{name: dns-tcp, port: 53, targetPort: 1053, protocol: TCP}}
"""
