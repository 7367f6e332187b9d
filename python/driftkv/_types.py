"""What the client takes and returns (plain dataclasses and named tuples;
the generated messages stay in driftkv._proto). Field meanings: docs/api.md
and proto/driftkv.proto."""
import dataclasses
from dataclasses import dataclass
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

Array = Any  # np.ndarray or torch.Tensor


@dataclass(frozen=True)
class DeviceInfo:
    """InfoResponse.devices: one device of the server (docs/nccl.md)."""
    device: int
    capacity_pages: int
    capacity_bytes: int


@dataclass(frozen=True)
class DeviceStats:
    """StatsResponse.devices: one device's share of the usage."""
    device: int
    sequences: int
    pages_in_use: int
    bytes_in_use: int


@dataclass(frozen=True)
class Info:
    """InfoResponse: the server's model shape, codec, limits, hot tier."""
    server_version: str
    backend: str
    layers: int
    kv_heads: int
    head_dim: int
    codec: str
    key_levels: int
    value_levels: int
    key_payload_bytes: int
    value_payload_bytes: int
    alpha: float
    page_tokens: int
    window_tokens: int
    page_bytes: int
    capacity_pages: int
    capacity_bytes: int
    key_bits_per_value: float
    value_bits_per_value: float
    max_message_bytes: int
    max_batch: int
    max_sequences: int
    ttl_seconds: float
    transform: str
    transforms_checksum: int
    transforms_calibration_tokens: int
    values_folded: bool
    page_format: str
    hot_tier: bool
    hot_capacity_bytes: int
    hot_capacity_pages: int
    hot_page_bytes: int
    hot_promotion: str
    hot_idle_seconds: float
    hot_keep_cold_copies: bool      # promoted layers' cold pages kept as copies (docs/hot_tier.md)
    draining: bool                  # SIGTERM received: new sequences refused (docs/reliability.md)
    restored_sequences: int         # restored from the snapshot at start
    verify_pages_on_attend: bool
    tombstone_seconds: float      # released ids are tombstoned this long (0: off)
    tls: bool                     # transport security of the port (docs/security.md)
    client_certificates: bool
    tokens: bool
    value_refit: str  # D-Quant's value grid: "unbiased", "norm" or "least_squares"
    nccl_version: int
    nccl_max_channels: int
    nccl_chunk_timeout_seconds: float
    nccl_idle_seconds: float
    nccl_max_chunk_bytes: int
    devices: Tuple[DeviceInfo, ...]
    region_socket: str            # host regions attach here ("": off; docs/api.md, "Memory regions")
    max_region_bytes: int
    region_lease_seconds: int     # the default lease
    max_region_lease_seconds: int
    max_regions: int              # per tenant


@dataclass(frozen=True)
class Stats:
    """StatsResponse: usage and totals (pages_* and bytes_* count the cold pool)."""
    sequences: int
    pages_in_use: int
    capacity_pages: int
    bytes_in_use: int
    capacity_bytes: int
    tokens_compressed: int
    tokens_window: int
    window_bytes: int
    sequences_expired: int
    sequences_released: int
    tokens_ingested: int
    bytes_ingested: int
    attention_tokens: int
    symbols_key: int
    symbols_moved_key: int
    symbols_value: int
    symbols_moved_value: int
    encode_retries: int
    hot_pages_in_use: int
    hot_capacity_pages: int
    hot_bytes_in_use: int
    hot_capacity_bytes: int
    hot_layers: int
    promotions: int
    demotions: int
    pages_promoted: int
    pages_demoted: int
    pages_encoded_hot: int          # of pages_promoted: new pages of hot layers encoded straight to level form
    cold_copy_pages: int            # of pages_in_use: cold copies of hot layers' pages, taken back on demand
    cold_copy_bytes: int
    pages_demoted_from_copies: int  # of pages_demoted: went back to their kept cold copy
    tenant: str                   # the caller's tenant ("" without tokens) and its figures
    tenant_sequences: int
    tenant_pages: int
    tenant_max_sequences: int     # 0: unlimited
    tenant_max_pages: int
    tombstones: int               # released ids still tombstoned (all tenants)
    nccl_channels_open: int
    nccl_channels_opened: int
    nccl_channels_aborted: int
    nccl_channels_idle_closed: int
    nccl_chunks: int
    devices: Tuple[DeviceStats, ...]
    checksum_failures: int          # pages that failed their CRC-32C (docs/reliability.md)
    snapshot_corrupt_pages: int
    snapshot_dropped_sequences: int
    regions: int                    # registered now, all tenants
    region_bytes: int
    tenant_regions: int             # the caller's tenant's
    tenant_region_bytes: int
    regions_registered: int         # since start
    regions_expired: int
    tenant_bytes: int               # the caller's tenant's pages (both tiers) and windows, in bytes
    tenant_max_bytes: int           # 0: unlimited
    tenant_nccl_channels: int       # the caller's tenant's open NCCL channels
    tenant_max_nccl_channels: int   # 0: unlimited


_ITEMS = {("Info", "devices"): DeviceInfo, ("Stats", "devices"): DeviceStats}


def from_message(cls, message):
    """A dataclass of `cls` from the generated message's fields of the same
    names; repeated messages become tuples of their dataclasses."""
    def value(name):
        item = _ITEMS.get((cls.__name__, name))
        if item is None:
            return getattr(message, name)
        return tuple(from_message(item, m) for m in getattr(message, name))
    return cls(**{f.name: value(f.name) for f in dataclasses.fields(cls)})


class AppendResult(NamedTuple):
    chunks: int             # chunks accepted by the call
    tokens_stored: int      # new tokens stored
    tokens_duplicate: int   # tokens already stored, acknowledged only


class ReleaseResult(NamedTuple):
    tokens_freed: int
    pages_freed: int


class LayerLength(NamedTuple):
    tokens: int             # compressed_tokens + window_tokens
    compressed_tokens: int  # in pages (either tier)
    window_tokens: int      # in the bf16 window


class ForkResult(NamedTuple):
    layers: List[LayerLength]  # the new sequence's, layer 0 first: every token in pages
    pages_shared: int          # pages it took a reference to, all layers
    tokens: int = 0            # tokens taken per layer (whole pages)


class LookupResult(NamedTuple):
    """The longest prefix of a prompt the server's prefix index holds
    (docs/api.md, "Lookup")."""
    prompt_pages: int        # full pages in the prompt
    pages: int               # held in every layer (min of layer_pages)
    tokens: int              # pages * page_tokens
    layer_pages: List[int]   # leading pages held, per layer
    miss_reason: str         # "none", "never_stored", "evicted", "unhashed" or "diverged": of page `pages`
    miss_page: int
    miss_layer: int
    miss_message: str        # "" when nothing is missing


class PinResult(NamedTuple):
    """A pin of a stored prefix (docs/api.md, "Pin")."""
    tokens: int              # tokens pinned per layer (whole pages)
    pages_pinned: int        # pages referenced, all layers
    expire_unix_ms: int      # when the lease ends, by the server's clock
    replaced: bool           # a live pin of this id was replaced (renewed)


class PageEvent(NamedTuple):
    """One entry of the caller's tenant into the server's prefix index, or
    out of it (docs/api.md, "WatchPages")."""
    kind: str                # "stored" (Lookup finds it) or "evicted" (Lookup says "evicted")
    page_key: bytes          # 16 bytes: driftkv.prefix.page_keys' key of the page
    layer: int


class PageEventBatch(NamedTuple):
    """One message of a page watch: its events in the order they happened,
    and the events this subscriber missed before them because its buffer
    on the server was full (nonzero: the picture has gaps; rebuild it with
    lookup and keep reading)."""
    events: List[PageEvent]
    dropped: int


class Attention(NamedTuple):
    """A batch's attention: output float32 [items, q_heads, head_dim] and lse
    float32 [items, q_heads] (ln sum_t exp(scale q.k_t)); without the item
    axis for a single item."""
    output: Array
    lse: Array


class AttendResult(NamedTuple):
    output: Array           # float32 [q_heads, head_dim]
    lse: Array              # float32 [q_heads]
    tokens: int             # tokens attended
    compressed_tokens: int  # of them in pages


class ReadResult(NamedTuple):
    keys: Array             # float32 [tokens, kv_heads, head_dim]
    values: Array
    compressed_tokens: int  # how many came from pages


@dataclass
class Chunk:
    """One piece of one layer: keys and values [tokens, kv_heads, head_dim]
    (numpy or torch) starting at token `first_token`."""
    sequence_id: str
    layer: int
    first_token: int
    keys: Array
    values: Array
    wire_dtype: Optional[str] = None  # "bf16", "fp16", "f32"; None: the keys' own
    # Starts a new sequence under an id released less than
    # Info.tombstone_seconds ago (docs/api.md, "Release").
    new_incarnation: bool = False
    # The tokens' ids, one per token, or None (docs/prefix_cache.md): they
    # name the sequence's pages in the server's prefix index.
    token_ids: Optional[Sequence[int]] = None


@dataclass
class AttendItem:
    """One decode-attention problem. query [q_heads, head_dim]; a decode
    step appends new_key/new_value [kv_heads, head_dim] first. Set
    new_token_index (the step's position) to make the step idempotent: the
    client then retries it (docs/python.md, "Retries")."""
    sequence_id: str
    layer: int
    query: Array
    new_key: Optional[Array] = None
    new_value: Optional[Array] = None
    new_token_index: Optional[int] = None
    softmax_scale: Optional[float] = None
