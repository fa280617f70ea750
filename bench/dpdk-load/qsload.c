/*
 * qsload: a third-party load for vhost-user switches. One DPDK process on one lcore drives two
 * virtio-user ports, the driver DPDK guests and containers use, with their default features:
 * it generates UDP frames on port 0 (like testpmd's txonly) and sinks what arrives on port 1
 * (like rxonly), polling both in one loop. Notifications stay off, as in any DPDK guest.
 *
 * Build (the bench does this): cc -O2 qsload.c $(pkg-config --cflags --libs libdpdk) -o qsload
 *
 * Run:
 *   qsload --no-huge -m 1024 --no-pci --iova-mode=va --file-prefix qsl$$ -l 0 \
 *       --vdev net_virtio_user0,path=/run/a.sock,queues=1[,server=1] \
 *       --vdev net_virtio_user1,path=/run/b.sock,queues=1[,server=1] \
 *       -- --size 64 --seconds 10 [--warmup 2] [--flows 4 | --new-flows] [--link-timeout 15] \
 *          [--pools 1|2]
 *
 * Port 0 sends from 02:00:00:00:00:0a to 02:00:00:00:00:0b; port 1 has 02:00:00:00:00:0b and
 * first announces itself (a few broadcast frames) so a learning switch knows where it is before
 * the measurement. The buffers come from one pool of 8191 mbufs (`--pools 1`, the default) or,
 * as a guest with a larger working set has them, from two pools of 16383 mbufs, one that the
 * generator sends from and one that the receive rings are filled from (`--pools 2`).
 * Flows differ in the UDP source port (1024 + flow, wrapping past 65535): `--flows N` cycles
 * through N of them frame by frame. `--new-flows` gives every frame a 5-tuple not sent before in
 * the run (a connection-tracking switch sees each frame as a new connection): the source port
 * walks 1024..65535, then the source address steps through 10.128.0.0/9, so 2^32 frames pass
 * before a tuple repeats.
 * Prints one JSON object on stdout: frames sent and received in the measured
 * window, Mpps each way, and the received count of every second.
 */
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_ether.h>
#include <rte_ip.h>
#include <rte_mbuf.h>
#include <rte_udp.h>

#define BURST 32
#define RING 1024
#define MAX_SECONDS 3600

static volatile int stop;
static void on_signal(int sig) { (void)sig; stop = 1; }

static const struct rte_ether_addr GEN_MAC = {{0x02, 0, 0, 0, 0, 0x0a}};
static const struct rte_ether_addr SINK_MAC = {{0x02, 0, 0, 0, 0, 0x0b}};

static int port_init(uint16_t port, struct rte_mempool *pool)
{
	struct rte_eth_conf conf;
	memset(&conf, 0, sizeof(conf));
	int r = rte_eth_dev_configure(port, 1, 1, &conf);
	if (r < 0)
		return r;
	r = rte_eth_rx_queue_setup(port, 0, RING, rte_eth_dev_socket_id(port), NULL, pool);
	if (r < 0)
		return r;
	r = rte_eth_tx_queue_setup(port, 0, RING, rte_eth_dev_socket_id(port), NULL);
	if (r < 0)
		return r;
	return rte_eth_dev_start(port);
}

/* Ethernet + IPv4 + UDP frame of `size` bytes (without FCS) from src to dst, flow `flow`. */
static void fill(struct rte_mbuf *m, uint16_t size, const struct rte_ether_addr *src,
		 const struct rte_ether_addr *dst, uint16_t flow)
{
	char *p = rte_pktmbuf_append(m, size);
	memset(p, 0, size);
	struct rte_ether_hdr *eth = (struct rte_ether_hdr *)p;
	rte_ether_addr_copy(dst, &eth->dst_addr);
	rte_ether_addr_copy(src, &eth->src_addr);
	eth->ether_type = rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4);
	struct rte_ipv4_hdr *ip = (struct rte_ipv4_hdr *)(eth + 1);
	ip->version_ihl = RTE_IPV4_VHL_DEF;
	ip->total_length = rte_cpu_to_be_16(size - sizeof(*eth));
	ip->time_to_live = 64;
	ip->next_proto_id = IPPROTO_UDP;
	ip->src_addr = rte_cpu_to_be_32(0x0a000001);
	ip->dst_addr = rte_cpu_to_be_32(0x0a000002);
	ip->hdr_checksum = rte_ipv4_cksum(ip);
	struct rte_udp_hdr *udp = (struct rte_udp_hdr *)(ip + 1);
	udp->src_port = rte_cpu_to_be_16(1024 + flow);
	udp->dst_port = rte_cpu_to_be_16(9);
	udp->dgram_len = rte_cpu_to_be_16(size - sizeof(*eth) - sizeof(*ip));
}

static int wait_link(uint16_t port, double timeout_s)
{
	uint64_t hz = rte_get_timer_hz(), end = rte_get_timer_cycles() + (uint64_t)(timeout_s * hz);
	struct rte_eth_link link;
	while (!stop && rte_get_timer_cycles() < end) {
		memset(&link, 0, sizeof(link));
		if (rte_eth_link_get_nowait(port, &link) == 0 && link.link_status)
			return 0;
		rte_delay_ms(10);
	}
	return -1;
}

static void drain(uint16_t port)
{
	struct rte_mbuf *rx[BURST];
	uint16_t n = rte_eth_rx_burst(port, 0, rx, BURST);
	rte_pktmbuf_free_bulk(rx, n);
}

int main(int argc, char **argv)
{
	int eal = rte_eal_init(argc, argv);
	if (eal < 0) {
		fprintf(stderr, "qsload: EAL init failed: %s\n", rte_strerror(rte_errno));
		return 2;
	}
	argc -= eal;
	argv += eal;
	unsigned size = 64, flows = 4, pools = 1, new_flows = 0;
	double seconds = 10, warmup = 2, link_timeout = 15;
	static const struct option opts[] = {
		{"size", required_argument, 0, 's'},   {"seconds", required_argument, 0, 't'},
		{"warmup", required_argument, 0, 'w'}, {"flows", required_argument, 0, 'f'},
		{"link-timeout", required_argument, 0, 'l'}, {"pools", required_argument, 0, 'p'},
		{"new-flows", no_argument, 0, 'n'},
		{0, 0, 0, 0},
	};
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 's': size = (unsigned)strtoul(optarg, NULL, 10); break;
		case 't': seconds = strtod(optarg, NULL); break;
		case 'w': warmup = strtod(optarg, NULL); break;
		case 'f': flows = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'l': link_timeout = strtod(optarg, NULL); break;
		case 'p': pools = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'n': new_flows = 1; break;
		default: fprintf(stderr, "qsload: bad argument\n"); return 2;
		}
	}
	if (size < 60 || size > 9000 || flows < 1 || flows > 65535 || !(seconds > 0) ||
	    seconds > MAX_SECONDS || warmup < 0 || pools < 1 || pools > 2) {
		fprintf(stderr, "qsload: --size 60..9000, --flows 1..65535, 0 < --seconds <= %d, "
				"--pools 1 or 2\n",
			MAX_SECONDS);
		return 2;
	}
	if (rte_eth_dev_count_avail() < 2) {
		fprintf(stderr, "qsload: needs two ports (--vdev net_virtio_user0,... and 1)\n");
		return 2;
	}
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);

	unsigned data = size + RTE_PKTMBUF_HEADROOM > RTE_MBUF_DEFAULT_BUF_SIZE
				? size + RTE_PKTMBUF_HEADROOM
				: RTE_MBUF_DEFAULT_BUF_SIZE;
	/* `pool` is what the generator sends from; `rx_pool` fills both ports' receive rings. */
	struct rte_mempool *pool = rte_pktmbuf_pool_create(
		"qsload", pools == 1 ? 8191 : 16383, 256, 0, data, rte_socket_id());
	struct rte_mempool *rx_pool =
		pools == 1 ? pool
			   : rte_pktmbuf_pool_create("qsload-rx", 16383, 256, 0, data, rte_socket_id());
	if (!pool || !rx_pool) {
		fprintf(stderr, "qsload: no mbuf pool: %s\n", rte_strerror(rte_errno));
		return 2;
	}
	const uint16_t gen = 0, sink = 1;
	for (uint16_t p = 0; p < 2; p++) {
		int r = port_init(p, rx_pool);
		if (r < 0) {
			fprintf(stderr, "qsload: port %u: %s\n", p, rte_strerror(-r));
			return 2;
		}
	}
	if (wait_link(gen, link_timeout) < 0 || wait_link(sink, link_timeout) < 0) {
		fprintf(stderr, "qsload: link did not come up within %.0f s\n", link_timeout);
		return 3;
	}

	/* Let the switch learn both stations: a few broadcasts from each. */
	for (int round = 0; round < 20 && !stop; round++) {
		struct rte_mbuf *m[2];
		if (rte_pktmbuf_alloc_bulk(pool, m, 2) == 0) {
			static const struct rte_ether_addr bcast = {{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}};
			fill(m[0], 60, &SINK_MAC, &bcast, 0);
			fill(m[1], 60, &GEN_MAC, &bcast, 0);
			if (!rte_eth_tx_burst(sink, 0, &m[0], 1))
				rte_pktmbuf_free(m[0]);
			if (!rte_eth_tx_burst(gen, 0, &m[1], 1))
				rte_pktmbuf_free(m[1]);
		}
		rte_delay_ms(10);
		drain(gen);
		drain(sink);
	}

	/* A template per flow; each burst copies templates into fresh mbufs (as txonly does). */
	struct rte_mbuf *tmpl[BURST];
	if (rte_pktmbuf_alloc_bulk(pool, tmpl, BURST) != 0) {
		fprintf(stderr, "qsload: no mbufs\n");
		return 2;
	}
	for (unsigned i = 0; i < BURST; i++)
		fill(tmpl[i], size, &GEN_MAC, &SINK_MAC, i % flows);

	uint64_t hz = rte_get_timer_hz();
	uint64_t start = rte_get_timer_cycles();
	uint64_t t0 = start + (uint64_t)(warmup * hz);
	uint64_t t1 = t0 + (uint64_t)(seconds * hz);
	uint64_t sent = 0, got = 0, sent0 = 0, got0 = 0, tx_full = 0;
	static uint64_t per_sec[MAX_SECONDS + 1];
	unsigned sec = 0;
	uint64_t next_sec = t0 + hz, got_sec = 0;
	int measuring = 0;
	struct rte_mbuf *tx[BURST], *rx[BURST];
	/* More flows than templates, or a new one per frame: each frame's tuple is set after the
	 * copy (the source port; with --new-flows also the source address and the IP checksum). */
	const int per_frame = new_flows || flows > BURST;
	const size_t l4 = sizeof(struct rte_ether_hdr) + sizeof(struct rte_ipv4_hdr);
	uint64_t next_flow = 0;
	for (;;) {
		uint64_t now = rte_get_timer_cycles();
		if (!measuring && now >= t0) {
			measuring = 1;
			sent0 = sent;
			got0 = got;
			got_sec = got;
		}
		if (measuring && now >= next_sec && sec < MAX_SECONDS) {
			per_sec[sec++] = got - got_sec;
			got_sec = got;
			next_sec += hz;
		}
		if (now >= t1 || stop)
			break;
		if (rte_pktmbuf_alloc_bulk(pool, tx, BURST) == 0) {
			for (unsigned i = 0; i < BURST; i++) {
				rte_memcpy(rte_pktmbuf_mtod(tx[i], void *),
					   rte_pktmbuf_mtod(tmpl[i], void *), size);
				tx[i]->data_len = tx[i]->pkt_len = size;
				if (!per_frame)
					continue;
				char *p = rte_pktmbuf_mtod(tx[i], char *);
				struct rte_udp_hdr *udp = (struct rte_udp_hdr *)(p + l4);
				uint64_t k = next_flow++;
				if (new_flows) {
					struct rte_ipv4_hdr *ip =
						(struct rte_ipv4_hdr *)(p + sizeof(struct rte_ether_hdr));
					udp->src_port = rte_cpu_to_be_16(1024 + k % 64512);
					ip->src_addr = rte_cpu_to_be_32(0x0a800000u +
									(uint32_t)((k / 64512) & 0x7fffff));
					ip->hdr_checksum = 0;
					ip->hdr_checksum = rte_ipv4_cksum(ip);
				} else {
					udp->src_port = rte_cpu_to_be_16((uint16_t)(1024 + k % flows));
				}
			}
			uint16_t n = rte_eth_tx_burst(gen, 0, tx, BURST);
			sent += n;
			if (n < BURST) {
				tx_full++;
				rte_pktmbuf_free_bulk(tx + n, BURST - n);
			}
		}
		uint16_t n = rte_eth_rx_burst(sink, 0, rx, BURST);
		got += n;
		rte_pktmbuf_free_bulk(rx, n);
		drain(gen);
	}
	uint64_t end = rte_get_timer_cycles();
	double window = measuring ? (double)((end < t1 ? end : t1) - t0) / hz : 0;
	uint64_t s = sent - sent0, g = got - got0;
	printf("{\"size\":%u,\"new_flows\":%s,\"flows_sent\":%" PRIu64 ",\"flows\":%u,\"pools\":%u,\"seconds\":%.3f,\"sent\":%" PRIu64 ",\"received\":%" PRIu64
	       ",\"tx_mpps\":%.4f,\"rx_mpps\":%.4f,\"tx_ring_full_bursts\":%" PRIu64 ",\"per_second\":[",
	       size, new_flows ? "true" : "false", per_frame ? (new_flows ? next_flow : flows) : flows,
	       flows, pools, window, s, g, window > 0 ? s / window / 1e6 : 0,
	       window > 0 ? g / window / 1e6 : 0, tx_full);
	for (unsigned i = 0; i < sec; i++)
		printf("%s%" PRIu64, i ? "," : "", per_sec[i]);
	printf("]}\n");
	fflush(stdout);
	rte_pktmbuf_free_bulk(tmpl, BURST);
	for (uint16_t p = 0; p < 2; p++) {
		rte_eth_dev_stop(p);
		rte_eth_dev_close(p);
	}
	rte_eal_cleanup();
	return measuring ? 0 : 3;
}
