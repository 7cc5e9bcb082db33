package egress

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"testing"

	"github.com/sandboxd/sandboxd/runtime/egress/policy"
)

// benchPolicy is a 20-rule policy of the kind issue #22 measures: address
// blocks, single ports and port ranges, allowed inside a deny-all and
// denied.
func benchPolicy(tb testing.TB) *policy.Policy {
	allow := []string{
		"1.1.1.1", "8.8.8.0/24", "9.9.9.9:53", "104.16.0.0/13", "151.101.0.0/16:443",
		"140.82.112.0/20:22", "13.32.0.0/15", "52.0.0.0/11:80-443", "34.64.0.0/10", "35.190.0.0/17:8000-8999",
		"142.250.0.0/15", "172.217.0.0/16:443", "185.199.108.0/22",
	}
	deny := []string{
		policy.AllTraffic, "8.8.8.8", "104.16.1.0/24:25", "13.32.4.0/24", "45.0.0.0/8:6667-7000",
		"203.0.113.0/24", "2001:db8::/32",
	}
	p, err := policy.Parse(allow, deny)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// BenchmarkSetPolicy: what a 20-rule policy adds to a create, with no
// other sandbox's policy in the table and with 100.
func BenchmarkSetPolicy(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root for nftables")
	}
	if err := HaveNft(); err != nil {
		b.Skip(err)
	}
	p := benchPolicy(b)
	for _, others := range []int{0, 100} {
		b.Run(fmt.Sprintf("others=%d", others), func(b *testing.B) {
			e := testEgress(b, netip.MustParsePrefix("10.139.240.0/24"), nil, nil)
			if err := e.Setup(); err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			a := netip.MustParseAddr("10.139.240.2")
			for i := 0; i < others; i++ {
				a = a.Next()
				if err := e.SetPolicy(ctx, "other", a, p); err != nil {
					b.Fatal(err)
				}
			}
			ip := a.Next()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := e.SetPolicy(ctx, "sbx", ip, p); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := e.ClearPolicy(ip); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}
