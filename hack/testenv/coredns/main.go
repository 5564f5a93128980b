// CoreDNS with only the plugins the test bed's cluster DNS uses, built the way
// CoreDNS documents for custom builds: our own main sets dnsserver.Directives
// (in plugin.cfg order) and imports just those plugins. The default build links
// every cloud provider's SDK; this one builds in a fraction of the time.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// The order is plugin.cfg's: it decides the order in which plugins see a query.
var directives = []string{
	"reload",
	"ready",
	"health",
	"errors",
	"log",
	"loadbalance",
	"cache",
	"kubernetes",
	"loop",
}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
