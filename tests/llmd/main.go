// llmd-indexer: a thin driver around llm-d's KV-cache indexer
// (github.com/llm-d/llm-d-kv-cache, pinned in go.mod) for kvtier's tests
// (tests/vllm/test_llmd_indexer.py, docs/events.md "Routers").
//
// It runs the library's own pieces and nothing else: the in-memory kvblock
// index, the kvevents pool with its vLLM engine adapter (which decodes the
// msgpack KVEventBatch) and its ZMQ subscriber manager, the token processor
// that turns token ids into the index's request keys, and the
// LongestPrefix scorer with per-medium weights. No tokenizer: queries give
// token ids, as a router that tokenizes outside calls ScoreTokens.
//
//	llmd-indexer -sub podA=tcp://127.0.0.1:5557 -sub podB=tcp://... \
//	    -weight cpu=0.8 -weight storage:fs[0]=0.5 -block-size 16
//
// Each -sub subscribes to the topic kv@POD@ (the indexer reads the pod and
// the model from a topic kv@POD@MODEL); a pod may be named more than once
// (vLLM's own publisher and kvtier's, both with that pod's topic). Queries are JSON lines on stdin,
// one JSON line back on stdout each:
//
//	{"op":"score","model":M,"tokens":[...],"pods":[...]}  -> {"scores":{pod:score},
//	     "keys":[request keys], "media":{medium:{pod:score}}, "hits":{pod:{medium:n}}}
//	{"op":"keys","model":M,"tokens":[...]}               -> {"keys":[...]}
//	{"op":"engine","hashes":["hex"|int,...]}             -> {"request_keys":[key|null,...]}
//	{"op":"lookup","keys":[request keys]}                -> {"pods":{key:["pod@medium",...]}}
//
// "media" scores the prompt once per medium with only that medium's entries
// (weight 1 each): the longest prefix each pod holds in that tier.
// "hits" counts, per pod and medium, the prompt's keys held there.
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/sets"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/llm-d/llm-d-kv-cache/pkg/kvcache"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvcache/kvblock"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvevents"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvevents/engineadapter"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

type request struct {
	Op     string            `json:"op"`
	Model  string            `json:"model"`
	Tokens []uint32          `json:"tokens"`
	Pods   []string          `json:"pods"`
	Hashes []json.RawMessage `json:"hashes"`
	Keys   []uint64          `json:"keys"`
}

func main() {
	var subs, weights multi
	flag.Var(&subs, "sub", "POD=ENDPOINT: subscribe to ENDPOINT's topic kv@POD@ (repeatable)")
	flag.Var(&weights, "weight", "MEDIUM=W: the scorer's weight of a medium, lower case (repeatable; default gpu=1, cpu=0.8)")
	blockSize := flag.Int("block-size", 16, "the indexer's canonical block size in tokens (blockSizeTokens)")
	seed := flag.String("hash-seed", "", "the token processor's hash seed (hashSeed)")
	verbose := flag.Int("v", 0, "log level for the library's logs on stderr (0: errors only, 1 info, 2 debug...)")
	flag.Parse()

	level := slog.Level(8 - 4*(*verbose)) // 0: error; 2: info; >2: the library's V(n) levels
	if *verbose > 0 {
		level = slog.Level(-*verbose)
	}
	ctrllog.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	cfg, err := kvcache.NewDefaultConfig()
	must(err)
	if len(weights) > 0 {
		cfg.BackendConfigs = nil
		for _, w := range weights {
			name, val, ok := strings.Cut(w, "=")
			f, err := strconv.ParseFloat(val, 64)
			if !ok || err != nil {
				must(fmt.Errorf("-weight %q: want MEDIUM=NUMBER", w))
			}
			cfg.BackendConfigs = append(cfg.BackendConfigs, &kvcache.KVCacheBackendConfig{Name: name, Weight: f})
		}
	}
	tp, err := kvblock.NewChunkedTokenDatabase(&kvblock.TokenProcessorConfig{BlockSizeTokens: *blockSize, HashSeed: *seed})
	must(err)
	indexer, err := kvcache.NewKVCacheIndexer(ctx, cfg, tp)
	must(err)
	go indexer.Run(ctx)

	poolCfg := kvevents.DefaultConfig()
	poolCfg.DiscoverPods = false
	poolCfg.Concurrency = 2
	pool := kvevents.NewPool(poolCfg, indexer.KVBlockIndex(), tp, engineadapter.NewVLLMAdapter())
	pool.Start(ctx)
	sm := kvevents.NewSubscriberManager(pool)
	for i, s := range subs {
		pod, ep, ok := strings.Cut(s, "=")
		if !ok {
			must(fmt.Errorf("-sub %q: want POD=ENDPOINT", s))
		}
		// the manager keeps one subscriber per name; a pod may have several
		// publishers (vLLM's and kvtier's): the index takes the pod from the
		// topic, not from this name
		must(sm.EnsureSubscriber(ctx, fmt.Sprintf("%s#%d", pod, i), ep, "kv@"+pod+"@", true))
	}
	// one medium at a time, weight 1: the longest prefix each pod holds in it
	perMedium, err := kvcache.NewKVBlockScorer(&kvcache.KVBlockScorerConfig{ScoringStrategy: kvcache.LongestPrefixMatch})
	must(err)

	out := json.NewEncoder(os.Stdout)
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	fmt.Fprintln(os.Stdout, `{"ready":true}`)
	for in.Scan() {
		var req request
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			_ = out.Encode(map[string]any{"error": err.Error()})
			continue
		}
		resp, err := handle(ctx, indexer, perMedium, &req)
		if err != nil {
			resp = map[string]any{"error": err.Error()}
		}
		_ = out.Encode(resp)
	}
	sm.Shutdown(ctx)
	cancel()
}

func handle(ctx context.Context, ix *kvcache.Indexer, perMedium kvcache.KVBlockScorer, req *request) (map[string]any, error) {
	index := ix.KVBlockIndex()
	switch req.Op {
	case "keys":
		keys, err := ix.ComputeBlockKeysFromTokens(ctx, req.Tokens, req.Model, nil)
		return map[string]any{"keys": u64s(keys)}, err
	case "engine":
		rks := make([]any, len(req.Hashes))
		for i, raw := range req.Hashes {
			ek, err := engineKey(raw)
			if err != nil {
				return nil, err
			}
			if rk, err := index.GetRequestKey(ctx, ek); err == nil {
				rks[i] = uint64(rk)
			}
		}
		return map[string]any{"request_keys": rks}, nil
	case "lookup":
		keys := make([]kvblock.BlockHash, len(req.Keys))
		for i, k := range req.Keys {
			keys[i] = kvblock.BlockHash(k)
		}
		pods := map[string][]string{}
		if len(keys) > 0 {
			got, err := index.Lookup(ctx, keys, sets.New[string]())
			if err != nil {
				return nil, err
			}
			for k, entries := range got {
				pods[k.String()] = entryNames(entries)
			}
		}
		return map[string]any{"pods": pods}, nil
	case "score":
		scores, err := ix.ScoreTokens(ctx, req.Tokens, req.Model, req.Pods, nil)
		if err != nil {
			return nil, err
		}
		keys, err := ix.ComputeBlockKeysFromTokens(ctx, req.Tokens, req.Model, nil)
		if err != nil {
			return nil, err
		}
		media := map[string]map[string]float64{}
		hits := map[string]map[string]int{}
		if len(keys) > 0 {
			got, err := index.Lookup(ctx, keys, sets.New(req.Pods...))
			if err != nil {
				return nil, err
			}
			byMedium := map[string]map[kvblock.BlockHash][]kvblock.PodEntry{}
			for k, entries := range got {
				for _, e := range entries {
					if byMedium[e.DeviceTier] == nil {
						byMedium[e.DeviceTier] = map[kvblock.BlockHash][]kvblock.PodEntry{}
					}
					byMedium[e.DeviceTier][k] = append(byMedium[e.DeviceTier][k], e)
					if hits[e.PodIdentifier] == nil {
						hits[e.PodIdentifier] = map[string]int{}
					}
					hits[e.PodIdentifier][e.DeviceTier]++
				}
			}
			for m, k2p := range byMedium {
				s, err := perMedium.Score(ctx, keys, k2p)
				if err != nil {
					return nil, err
				}
				media[m] = s
			}
		}
		if scores == nil {
			scores = map[string]float64{}
		}
		return map[string]any{"scores": scores, "keys": u64s(keys), "media": media, "hits": hits}, nil
	}
	return nil, fmt.Errorf("unknown op %q", req.Op)
}

// engineKey: an engine block hash as the vLLM adapter turns it into the
// index's engine key: a hex string stands for the msgpack bin (the adapter
// takes its last 8 bytes, big-endian), a number for an integer hash.
func engineKey(raw json.RawMessage) (kvblock.BlockHash, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		b, err := hex.DecodeString(s)
		if err != nil || len(b) == 0 {
			return 0, fmt.Errorf("hash %q: want hex", s)
		}
		if len(b) < 8 {
			b = append(make([]byte, 8-len(b)), b...)
		}
		return kvblock.BlockHash(binary.BigEndian.Uint64(b[len(b)-8:])), nil
	}
	var n uint64
	if err := json.Unmarshal(raw, &n); err != nil {
		return 0, fmt.Errorf("hash %s: want a hex string or an integer", raw)
	}
	return kvblock.BlockHash(n), nil
}

func entryNames(entries []kvblock.PodEntry) []string {
	names := make([]string, len(entries))
	for i := range entries {
		names[i] = entries[i].PodIdentifier + "@" + entries[i].DeviceTier
	}
	sort.Strings(names)
	return names
}

func u64s(keys []kvblock.BlockHash) []uint64 {
	r := make([]uint64, len(keys))
	for i, k := range keys {
		r[i] = uint64(k)
	}
	return r
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "llmd-indexer:", err)
		os.Exit(2)
	}
}
