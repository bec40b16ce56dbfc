"""The test harness shared by tests/integration, tests/vllm and bench/.

Imported as the package `support`, with tests/ on sys.path: pytest.ini's
`pythonpath` puts tests/ (and python/, for the kvtier module) there for
every pytest run; a script under bench/ puts both there itself before its
first import of support. Test modules import from here, never from a
conftest or from another test module.

    paths          ROOT, BIN, LIB (KVTIER_BIN / KVTIER_LIB)
    ports          free_port(): never the same port twice in a row
    server         Server (kvtier on free ports, its own directory),
                   start_on_free_port, wait_for, run_kvtier, l2_status,
                   Kills, SLOW, SANITIZER_MARKERS
    data           keys_for, random_payloads, adapter_json, file helpers,
                   the Mooncake trace
    faultio        the LD_PRELOAD fault library (FAULTIO, needs_faultio)
    rawproto       raw protocol clients (ZeroMQ DEALER, same-host socket)
    redis_servers  redis-server and a Redis Cluster on free ports
    s3_servers     s3rver (s3server/) and versitygw on free ports
    azurite        Azurite (azurite/) on a free port
    faultload      steady verified load for the Redis tier's fault tests
    faultproxy     a TCP proxy switched at run time between faults
    install        the build tree's install rules (InstalledServer, ...)
    shared_l2      several servers on one L2: the shared workload
    shared_budget  several servers under one shared byte cap: the workload
    model          tiny random Llama models built locally (nothing downloaded)
    engine         a vLLM engine in its own process
    prompts        the real-vLLM tests' prompts and the keys they store
"""
