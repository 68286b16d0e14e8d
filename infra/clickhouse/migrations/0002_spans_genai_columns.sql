-- GenAI columns the reports group by, materialised at insert from the span's attributes (SigNoz's pattern), so a
-- report over millions of spans reads three narrow columns instead of the attribute map. Token usage has two
-- spellings in the wild (input/output and the older prompt/completion); either one is taken.
ALTER TABLE spans
    ADD COLUMN IF NOT EXISTS model LowCardinality(String) MATERIALIZED
        if(mapContains(SpanAttributes, 'gen_ai.request.model'), SpanAttributes['gen_ai.request.model'],
           SpanAttributes['gen_ai.response.model']) CODEC(ZSTD(1)),
    ADD COLUMN IF NOT EXISTS input_tokens UInt64 MATERIALIZED
        toUInt64OrZero(if(mapContains(SpanAttributes, 'gen_ai.usage.input_tokens'),
                          SpanAttributes['gen_ai.usage.input_tokens'], SpanAttributes['gen_ai.usage.prompt_tokens']))
        CODEC(T64, ZSTD(1)),
    ADD COLUMN IF NOT EXISTS output_tokens UInt64 MATERIALIZED
        toUInt64OrZero(if(mapContains(SpanAttributes, 'gen_ai.usage.output_tokens'),
                          SpanAttributes['gen_ai.usage.output_tokens'], SpanAttributes['gen_ai.usage.completion_tokens']))
        CODEC(T64, ZSTD(1))
