# CoreDNS for the test bed's cluster DNS, from the binary hack/testenv/build.sh built
# (hack/testenv/coredns). Non-root: the Corefile listens on 1053, and the kube-dns
# Service maps port 53 to it.
FROM scratch
COPY coredns /coredns
USER 65532:65532
ENTRYPOINT ["/coredns"]
